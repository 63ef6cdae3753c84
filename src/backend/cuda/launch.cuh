#pragma once
// Kernel launches of the CUDA op set, with programmatic dependent launch (PDL, Hopper).
//
// A decode step is ~1,000 small kernels in a row; launched plainly, each one starts only once the
// one before it has drained, so every kernel boundary costs a launch, a ramp-up and a drain (2–7
// µs: a third of a batch-1 step). Launched with programmatic stream serialization, the next kernel's
// blocks are placed on the SMs while this one runs and stop at `wait_for_inputs()` until it has
// finished and its writes are visible; what comes before that point (issuing the loads of the
// weights, which no kernel writes) overlaps the previous kernel. In a captured graph the edge
// between two such kernels is a programmatic one, so decode-step replays keep the overlap.
//
// The contract every kernel launched through launch() keeps (the device half):
//   * before wait_for_inputs() it reads only what no kernel writes (weights, tables) and writes
//     nothing;
//   * every block reaches wait_for_inputs() before it exits, also a block with no work: a grid then
//     finishes only after the one before it has, so waiting on the previous kernel is waiting on
//     every kernel before it;
//   * launch_next() comes after the wait (the next kernel's blocks take SM space only once this
//     grid is running for real, never a chain of waiting grids).
// Both are no-ops when the kernel was launched without the attribute (programmatic_launch(false)).
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backend/cuda/check.h"

namespace dsv41::cuda {

__device__ __forceinline__ void wait_for_inputs() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void launch_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// The two at the top of a kernel that has nothing to issue before its inputs.
__device__ __forceinline__ void enter() { wait_for_inputs(), launch_next(); }

// Weight bytes [p, p + bytes) towards L2 (one instruction, the copy engine walks the range; p and
// bytes multiples of 16): what a kernel issues before it waits, so that its weights stream in while
// the kernel before it still runs.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += int64_t(1) << 30)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(static_cast<const char*>(p) + at),
                 "r"(uint32_t(bytes - at < (int64_t(1) << 30) ? bytes - at : int64_t(1) << 30))
                 : "memory");
}

// Whether launch() asks for programmatic serialization (default on; off for a benchmark's "before"
// column). Read at each launch, so a graph keeps what it was captured with.
inline bool& programmatic_launch_flag() {
  static bool on = true;
  return on;
}
inline void programmatic_launch(bool on) { programmatic_launch_flag() = on; }

// kernel<<<grid, block, smem, stream>>>(args...), with the attribute; a launch error names `where`.
template <typename... Params, typename... Args>
void launch(const char* where, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch_flag() ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), where);
}

}  // namespace dsv41::cuda
