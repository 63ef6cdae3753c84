// mHC kernels.
//
// hc_mixes runs as two kernels. mix_partials: grid (rows, splits), each block takes a slice of a
// token's flattened streams (hc·d = 20480 in V4.1) and accumulates the sum of squares and the
// (2 + hc)·hc = 24 dot products with hc_fn's rows over it; traffic per token: hc·d·4 (X) plus
// 24·hc·d·4 (hc_fn, 2 MB, shared by all tokens through L2). mix_finish: one thread per token adds
// the slices in order, applies the RMS and runs split_sinkhorn (backend/cpu/sinkhorn.h, the CPU's
// own code). hc_pre and hc_post are elementwise, one thread per output, with the CPU's operation
// order and no FMA contraction, so they match the CPU bit for bit; traffic (hc + 1)·d·4 read and
// d·4 written (pre), 2·hc·d·4 + d·4 read and hc·d·4 written (post).
#include "backend/cuda/mhc.h"

#include <string>

#include "backend/cpu/sinkhorn.h"
#include "backend/cuda/check.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxHc = 4;
constexpr int kMaxMix = (2 + kMaxHc) * kMaxHc;  // 24
constexpr int kSlice = 1024;                    // elements of a token's streams per block
constexpr int kSums = kMaxMix + 1;              // the mixes, then the sum of squares

__global__ void __launch_bounds__(kThreads) mix_partials(const float* X, int64_t n, int n_mix, const float* fn,
                                                          float* partials) {
  const int64_t row = blockIdx.x, slice = blockIdx.y;
  const float* x = X + row * n;
  float acc[kSums];
#pragma unroll
  for (int k = 0; k < kSums; ++k) acc[k] = 0;
  const int64_t end = (slice + 1) * kSlice < n ? (slice + 1) * kSlice : n;
  for (int64_t i = slice * kSlice + threadIdx.x; i < end; i += kThreads) {
    const float v = x[i];
#pragma unroll
    for (int k = 0; k < kMaxMix; ++k)
      if (k < n_mix) acc[k] = fmaf(v, fn[k * n + i], acc[k]);
    acc[kMaxMix] = fmaf(v, v, acc[kMaxMix]);
  }
  __shared__ float sums[kThreads / 32][kSums];
#pragma unroll
  for (int k = 0; k < kSums; ++k) {
    float s = acc[k];
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
    if (threadIdx.x % 32 == 0) sums[threadIdx.x / 32][k] = s;
  }
  __syncthreads();
  if (threadIdx.x < kSums) {
    float s = 0;
    for (int w = 0; w < kThreads / 32; ++w) s += sums[w][threadIdx.x];
    partials[(row * gridDim.y + slice) * kSums + threadIdx.x] = s;
  }
}

__global__ void mix_finish(const float* partials, int64_t rows, int slices, int64_t n, int hc, const float* scale,
                           const float* base, float norm_eps, int iters, float hc_eps, float* pre, float* post,
                           float* comb) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const int n_mix = (2 + hc) * hc;
  float m[kSums];
  for (int k = 0; k < kSums; ++k) m[k] = 0;
  for (int s = 0; s < slices; ++s)
    for (int k = 0; k < kSums; ++k) m[k] += partials[(row * slices + s) * kSums + k];
  const float inv = 1.0f / sqrtf(m[kMaxMix] / float(n) + norm_eps);  // rms_inverse
  for (int k = 0; k < n_mix; ++k) m[k] *= inv;
  split_sinkhorn(m, scale, base, hc, iters, hc_eps, pre + row * hc, post + row * hc, comb + row * hc * hc);
}

__global__ void hc_pre_kernel(const float* X, const float* pre, int64_t rows, int hc, int64_t d, float* y) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * d) return;
  const int64_t r = id / d, k = id % d;
  const float* x = X + r * hc * d + k;
  float sum = 0;
  for (int i = 0; i < hc; ++i) sum = __fadd_rn(sum, __fmul_rn(pre[r * hc + i], x[i * d]));
  y[id] = round_bf16(sum);
}

__global__ void hc_post_kernel(const float* f, const float* X, const float* post, const float* comb, int64_t rows,
                               int hc, int64_t d, float* out) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * hc * d) return;
  const int64_t k = id % d, j = id / d % hc, r = id / d / hc;
  const float* x = X + r * hc * d + k;
  const float* c = comb + r * hc * hc;
  float mix = 0;
  for (int i = 0; i < hc; ++i) mix = __fadd_rn(mix, __fmul_rn(c[i * hc + j], x[i * d]));
  out[id] = round_bf16(__fadd_rn(__fmul_rn(post[r * hc + j], f[r * d + k]), mix));
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void hc_mixes(const float* X, int64_t rows, int hc, int64_t d, const HcWeights& w, float norm_eps, int sinkhorn_iters,
              float hc_eps, float* pre, float* post, float* comb, cudaStream_t stream) {
  if (rows <= 0) return;
  if (hc < 1 || hc > kMaxHc) fail("cuda::hc_mixes", "hc_mult from 1 to 4", std::to_string(hc));
  if (w.fn.format != WeightFormat::F32 || w.base.format != WeightFormat::F32 || w.scale.format != WeightFormat::F32)
    fail("cuda::hc_mixes", "F32 hc_fn, hc_base and hc_scale", "another format");
  const int64_t n = hc * d;
  const int slices = int((n + kSlice - 1) / kSlice);
  float* partials = nullptr;
  keep_scratch_pool();
  check(cudaMallocAsync(reinterpret_cast<void**>(&partials), size_t(rows * slices * kSums) * sizeof(float), stream),
        "cuda::hc_mixes");
  mix_partials<<<dim3(unsigned(rows), unsigned(slices)), kThreads, 0, stream>>>(
      X, n, (2 + hc) * hc, reinterpret_cast<const float*>(w.fn.data), partials);
  check_launch("cuda::hc_mixes partials");
  mix_finish<<<unsigned((rows + 63) / 64), 64, 0, stream>>>(
      partials, rows, slices, n, hc, reinterpret_cast<const float*>(w.scale.data),
      reinterpret_cast<const float*>(w.base.data), norm_eps, sinkhorn_iters, hc_eps, pre, post, comb);
  check_launch("cuda::hc_mixes finish");
  check(cudaFreeAsync(partials, stream), "cuda::hc_mixes");
}

void hc_pre(const float* X, const float* pre, int64_t rows, int hc, int64_t d, float* y, cudaStream_t stream) {
  if (rows * d <= 0) return;
  hc_pre_kernel<<<blocks_for(rows * d), kThreads, 0, stream>>>(X, pre, rows, hc, d, y);
  check_launch("cuda::hc_pre");
}

void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
             float* out, cudaStream_t stream) {
  if (rows * d <= 0) return;
  hc_post_kernel<<<blocks_for(rows * hc * d), kThreads, 0, stream>>>(f, X, post, comb, rows, hc, d, out);
  check_launch("cuda::hc_post");
}

}  // namespace dsv41::cuda
