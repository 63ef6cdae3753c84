#pragma once
// Block-wide sums and maxima of the trainer's kernels and optimizers, in a fixed tree: each warp by
// xor shuffles, then the warps' results in warp order. The order depends only on the block size and
// the thread that holds each value, so a sum gives the same bits at every run (no atomics). Sums in
// float (the op set's kernels) or double (the optimizers' norms: Newton–Schulz's ‖Ĝ‖_F, the
// Sinkhorn update's row norms, whose CPU versions sum in double). And the segment a row of a batch
// falls in, for the losses batched over sequences.
#include <cuda_runtime.h>

#include <cstdint>

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

// The segment s whose rows begin[s] .. begin[s + 1] − 1 hold `row`: begin [segments + 1] ascending
// from begin[0] ≤ row < begin[segments]. A binary search keeping begin[lo] ≤ row < begin[hi]; it
// ends on a segment that holds the row, so never on an empty one.
__device__ inline int64_t segment_of(const int64_t* begin, int64_t segments, int64_t row) {
  int64_t lo = 0, hi = segments;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (begin[mid] <= row)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

}  // namespace dsv41::train_cuda
