#pragma once
// Programmatic dependent launch (PDL, sm_90): a kernel launched with launch_early may be scheduled
// before the kernel ahead of it on the stream has ended, so that its blocks' launch, and any reads
// of constants it issues first (weights: qgemv's first step, Mega-mHC's hc_fn), overlap that
// kernel's tail. Such a kernel must call wait_for_inputs() before it reads anything an earlier
// kernel writes and before it writes anything; the wait returns once the kernel ahead has completed
// and its writes are visible (and that kernel, having waited in turn, implies its own
// predecessors'). So what it reads before the wait must not be written by the kernel just ahead of
// it: weights and other constants only. Under stream capture the pair becomes a programmatic edge
// of the graph. BM_GraphChain (bench/cuda/kernels_bench.cu) measures a link on an H100: 1.36 → 1.00
// µs for an empty kernel, 5.14 → 4.25 µs for one reading 4 MB of weights with its first loads
// before the wait. The forward's kernels do not call release_dependents: in the chain it saves
// more (0.90, 3.66 µs), but in the decode step the next kernel's waiting blocks held the SMs that
// grids sized to the resident blocks count on (batch 1 12.84 → 13.27 ms; docs/benchmarks.md).
#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/check.h"

namespace dsv41::cuda {

// Waits for the kernel before this one on the stream (a no-op when not launched early).
__device__ __forceinline__ void wait_for_inputs() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel after this one on the stream, if launched early, start once every block of this
// one has started or called this (by default: once they have all ended).
__device__ __forceinline__ void release_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), allowed to start before the previous kernel on the
// stream ends: the kernel calls wait_for_inputs() as above. `where` names the op in an error.
template <typename... Params, typename... Args>
void launch_early(const char* where, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                  cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute early[1];
  early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  early[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{grid, block, smem, stream, early, 1};
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), where);
}

}  // namespace dsv41::cuda
