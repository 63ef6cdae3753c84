#pragma once
// Block-wide sums and maxima of the trainer's kernels, in a fixed tree: each warp by xor shuffles,
// then the warps' results in warp order. The order depends only on the block size and the thread
// that holds each value, so a sum gives the same bits at every run (no atomics).
#include <cuda_runtime.h>

namespace dsv41::train_cuda {

// Every thread of the block (kThreads, a multiple of 32) passes its value and gets the total.
// `scratch`: kThreads / 32 floats of shared memory, free for reuse when the call returns.
template <int kThreads>
__device__ inline float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total = __fadd_rn(total, scratch[w]);
  __syncthreads();
  return total;
}

template <int kThreads>
__device__ inline float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, scratch[w]);
  __syncthreads();
  return m;
}

}  // namespace dsv41::train_cuda
