#pragma once
// Block-wide sums in double for the optimizers' norms (Newton–Schulz's ‖Ĝ‖_F, the Sinkhorn
// update's row norms, whose CPU versions sum in double): a fixed tree, each warp by xor shuffles and
// then the warps in order (as train/cuda/reduce.cuh does for floats), so a sum gives the same bits
// at every run.
#include <cuda_runtime.h>

namespace dsv41::train_cuda::optim {

// Every thread of the block (kThreads, a multiple of 32) passes its value and gets the total.
// `scratch`: kThreads / 32 doubles of shared memory, free for reuse when the call returns.
template <int kThreads>
__device__ inline double block_sum_f64(double v, double* scratch) {
  for (int o = 16; o > 0; o /= 2) v = __dadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  double total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total = __dadd_rn(total, scratch[w]);
  __syncthreads();
  return total;
}

}  // namespace dsv41::train_cuda::optim
