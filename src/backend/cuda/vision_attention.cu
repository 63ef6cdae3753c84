// The ViT's attention (vision.h vision_attention; backend/cpu/vision.h): full, bidirectional, over
// one image's patches, per head. No existing kernel fits (the text attention reads SWA-FP8 and
// KV-FP4 caches with sinks); this one is plain and flash-style on the CUDA cores.
//
// A block is 8 warps and takes 64 queries of one head (grid: query blocks × heads); each warp owns
// 8 of them. The block walks the image's keys in tiles of 32: the tile's k and v rows go to shared
// memory (k rows padded to 65 floats, so that lane j reading k[j][d] hits bank (j + d) mod 32), then
// each warp, per query, scores lane j's key (q · k in fp32, times 1/√head_dim), takes the tile's
// maximum over the warp, rescales its running sum and output by exp(old max − new max) and adds
// p_j = exp(s_j − max) (online softmax); p goes through shared memory so that each lane adds
// Σ_j p_j · v[j][d] for its channels d = lane, lane + 32. At the end o = acc / Σ p, rounded to bf16.
// Shared memory: q 16 KB, k and v 16.5 KB, p 8 KB.
//
// Against the CPU op (full scores, one max, p/Σp, then P·V): the same products in fp32, summed in
// another order, and the softmax normalised at the end instead of before P·V, with CUDA's expf: the
// fp32 results differ in their last bits, which the bf16 rounding of o hides but for values near a
// rounding boundary (ops_vision_test bounds it).
//
// Traffic: q and o once; k and v of the head once per block of 64 queries (from L2: a head's k and v
// of a released-size image, 9,000 patches × 64 × 2 × 4 bytes = 4.6 MB, stay there). Work per head:
// 2·n²·head_dim multiply-adds on the CUDA cores.
#include <cmath>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/vision.h"
#include "base/error.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kWarps = 8, kRowsPerWarp = 8, kQueries = kWarps * kRowsPerWarp, kKeys = 32, kMaxHeadDim = 64;

// The same value in every lane: a xor butterfly adds (or compares) the same two values in each
// lane of a pair, so every lane ends with the same bits.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  return v;
}

__global__ void __launch_bounds__(kWarps * 32) vision_attention_kernel(const float* qkv, int64_t n, int heads, int hd,
                                                                       float scale, float* o) {
  __shared__ float q_s[kQueries][kMaxHeadDim];
  __shared__ float k_s[kKeys][kMaxHeadDim + 1];
  __shared__ float v_s[kKeys][kMaxHeadDim];
  __shared__ float p_s[kWarps][kRowsPerWarp][kKeys];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int h = int(blockIdx.y);
  const int64_t q0 = int64_t(blockIdx.x) * kQueries, width = int64_t(heads) * hd, stride = 3 * width;

  for (int i = int(threadIdx.x); i < kQueries * hd; i += kWarps * 32) {
    const int qi = i / hd, d = i % hd;
    const int64_t r = q0 + qi;
    q_s[qi][d] = r < n ? qkv[r * stride + int64_t(h) * hd + d] : 0.0f;
  }
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][2];
#pragma unroll
  for (int qi = 0; qi < kRowsPerWarp; ++qi) m[qi] = -INFINITY, l[qi] = 0.0f, acc[qi][0] = acc[qi][1] = 0.0f;

  for (int64_t k0 = 0; k0 < n; k0 += kKeys) {
    __syncthreads();  // the last tile is consumed (and q is loaded, the first time)
    for (int i = int(threadIdx.x); i < kKeys * hd; i += kWarps * 32) {
      const int j = i / hd, d = i % hd;
      const int64_t r = k0 + j;
      k_s[j][d] = r < n ? qkv[r * stride + width + int64_t(h) * hd + d] : 0.0f;
      v_s[j][d] = r < n ? qkv[r * stride + 2 * width + int64_t(h) * hd + d] : 0.0f;
    }
    __syncthreads();
    const bool valid = k0 + lane < n;  // lane 0 always is: k0 < n
    const int keys = n - k0 < kKeys ? int(n - k0) : kKeys;
#pragma unroll
    for (int qi = 0; qi < kRowsPerWarp; ++qi) {
      const float* q = q_s[warp * kRowsPerWarp + qi];
      float s = 0.0f;
      for (int d = 0; d < hd; ++d) s = __fadd_rn(s, __fmul_rn(q[d], k_s[lane][d]));
      s = valid ? __fmul_rn(s, scale) : -INFINITY;
      const float top = fmaxf(m[qi], warp_max(s));  // finite: lane 0's key is valid
      const float p = valid ? expf(__fsub_rn(s, top)) : 0.0f;
      const float alpha = expf(__fsub_rn(m[qi], top));  // 0 on the first tile (m = -inf)
      l[qi] = __fadd_rn(__fmul_rn(l[qi], alpha), warp_sum(p));
      m[qi] = top;
      acc[qi][0] = __fmul_rn(acc[qi][0], alpha);
      acc[qi][1] = __fmul_rn(acc[qi][1], alpha);
      p_s[warp][qi][lane] = p;
    }
    __syncwarp();
#pragma unroll
    for (int qi = 0; qi < kRowsPerWarp; ++qi)
      for (int j = 0; j < keys; ++j) {
        const float p = p_s[warp][qi][j];
        if (lane < hd) acc[qi][0] = __fadd_rn(acc[qi][0], __fmul_rn(p, v_s[j][lane]));
        if (lane + 32 < hd) acc[qi][1] = __fadd_rn(acc[qi][1], __fmul_rn(p, v_s[j][lane + 32]));
      }
  }
#pragma unroll
  for (int qi = 0; qi < kRowsPerWarp; ++qi) {
    const int64_t r = q0 + warp * kRowsPerWarp + qi;
    if (r >= n) continue;
    float* out = o + r * width + int64_t(h) * hd;
    if (lane < hd) out[lane] = round_bf16(__fdiv_rn(acc[qi][0], l[qi]));
    if (lane + 32 < hd) out[lane + 32] = round_bf16(__fdiv_rn(acc[qi][1], l[qi]));
  }
}

}  // namespace

void vision_attention(const float* qkv, int64_t n, int heads, int head_dim, float* o, cudaStream_t stream) {
  if (head_dim < 1 || head_dim > kMaxHeadDim)
    fail("cuda::vision_attention", "a head dimension of 1 to " + std::to_string(kMaxHeadDim), std::to_string(head_dim));
  if (heads < 1 || heads > 65535) fail("cuda::vision_attention", "1 to 65535 heads", std::to_string(heads));
  if (n <= 0) return;
  const float scale = 1.0f / std::sqrt(float(head_dim));  // the CPU op's
  const dim3 grid(unsigned((n + kQueries - 1) / kQueries), unsigned(heads));
  vision_attention_kernel<<<grid, kWarps * 32, 0, stream>>>(qkv, n, heads, head_dim, scale, o);
  check_launch("cuda::vision_attention");
}

}  // namespace dsv41::cuda
