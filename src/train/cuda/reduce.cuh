#pragma once
// Block-wide sums and maxima of the trainer's kernels and optimizers, in a fixed tree: each warp by
// xor shuffles, then the warps' results in warp order. The order depends only on the block size and
// the thread that holds each value, so a sum gives the same bits at every run (no atomics). Sums in
// float (the op set's kernels) or double (the optimizers' norms: Newton–Schulz's ‖Ĝ‖_F, the
// Sinkhorn update's row norms, whose CPU versions sum in double).
#include <cuda_runtime.h>

namespace dsv41::train_cuda {

// a + b rounded to nearest even, never contracted into an fma.
__device__ inline float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ inline double add_rn(double a, double b) { return __dadd_rn(a, b); }

// Every thread of the block (kThreads, a multiple of 32) passes its value and gets the total.
// T: float or double. `scratch`: kThreads / 32 values of shared memory, free for reuse when the
// call returns.
template <int kThreads, typename T>
__device__ inline T block_sum(T v, T* scratch) {
  for (int o = 16; o > 0; o /= 2) v = add_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total = add_rn(total, scratch[w]);
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
