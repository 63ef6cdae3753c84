// Engram: the gather of n-gram rows from the fp8 table, and the gate into the residual streams.
//
// gather_kernel: one thread per output value; the table rows are random ids into a table of up to
// 384 M rows (98 GB at hd 256), so each row is one 256-byte read plus its 8 scale bytes: traffic
// rows·cols·(hd + hd/32) bytes in, rows·cols·hd·4 out. Bit-exact (the codecs' scalar decode).
//
// gate_kernel: one block per (token, stream m): three block sums over d (Σh², Σkey², Σh·qk·key),
// then the gate and the update of the stream. The stream is read twice (the second time from
// L1/L2); traffic per token ≈ (2·hc + hc + 1 + hc)·d·4 bytes (X in and out, kv, qk). Differs from
// the CPU only by the order of the three fp32 sums and expf's last bit.
#include "backend/cuda/engram.h"

#include <cmath>

#include "backend/cuda/check.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

__global__ void gather_kernel(const uint8_t* table, const uint8_t* scales, int64_t hd, const int64_t* ids, int64_t n,
                              float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * hd) return;
  const int64_t id = ids[i / hd], c = i % hd;
  out[i] = round_bf16(e4m3_to_float(table[id * hd + c]) * e8m0_to_float(scales[id * (hd / 32) + c / 32]));
}

constexpr int kGateThreads = 256;

// Block-wide sum of three values; every thread gets the totals.
__device__ float3 block_sum3(float3 v) {
  __shared__ float3 warp_sums[kGateThreads / 32];
  for (int o = 16; o > 0; o /= 2) {
    v.x += __shfl_xor_sync(0xFFFFFFFFu, v.x, o);
    v.y += __shfl_xor_sync(0xFFFFFFFFu, v.y, o);
    v.z += __shfl_xor_sync(0xFFFFFFFFu, v.z, o);
  }
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
  __syncthreads();
  float3 total = make_float3(0, 0, 0);
  for (int w = 0; w < kGateThreads / 32; ++w) total.x += warp_sums[w].x, total.y += warp_sums[w].y, total.z += warp_sums[w].z;
  return total;
}

__global__ void __launch_bounds__(kGateThreads) gate_kernel(float* X, const float* kv, const float* qk, int hc, int64_t d,
                                                            float eps, float inv_sqrt_d, const uint8_t* shut) {
  const int64_t r = blockIdx.x / hc;
  const int m = blockIdx.x % hc;
  if (shut && shut[r]) return;  // the whole block: before any barrier
  float* h = X + (r * hc + m) * d;
  const float* key = kv + (r * (hc + 1) + m) * d;
  const float* value = kv + (r * (hc + 1) + hc) * d;
  const float* w = qk + m * d;
  float3 s = make_float3(0, 0, 0);
  for (int64_t i = threadIdx.x; i < d; i += kGateThreads) {
    s.x += h[i] * h[i];
    s.y += key[i] * key[i];
    s.z += h[i] * w[i] * key[i];
  }
  s = block_sum3(s);
  // rms_inverse's expression for each, then the CPU op's gate.
  const float rstd = (1.0f / sqrtf(s.x / float(d) + eps)) * (1.0f / sqrtf(s.y / float(d) + eps));
  const float dot = s.z * rstd * inv_sqrt_d;
  const float magnitude = fabsf(dot) > 1e-6f ? fabsf(dot) : 1e-6f;  // std::max(|dot|, 1e-6f)
  const float root = copysignf(sqrtf(magnitude), dot);
  const float gate = 1.0f / (1.0f + expf(-root));
  for (int64_t i = threadIdx.x; i < d; i += kGateThreads) h[i] = round_bf16(h[i] + gate * value[i]);
}

}  // namespace

void engram_gather(const uint8_t* table, const uint8_t* scales, int64_t hd, const int64_t* ids, int64_t rows, int cols,
                   float* out, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (hd <= 0 || hd % 32 != 0) fail("cuda::engram_gather", "hd a positive multiple of 32", std::to_string(hd));
  gather_kernel<<<unsigned((n * hd + 255) / 256), 256, 0, stream>>>(table, scales, hd, ids, n, out);
  check_launch("cuda::engram_gather");
}

void engram_gate(float* X, const float* kv, const float* qk, int64_t rows, int hc, int64_t d, float eps,
                 cudaStream_t stream, const uint8_t* shut) {
  if (rows <= 0 || hc <= 0) return;
  const float inv_sqrt_d = float(1.0 / std::sqrt(double(d)));
  gate_kernel<<<unsigned(rows * hc), kGateThreads, 0, stream>>>(X, kv, qk, hc, d, eps, inv_sqrt_d, shut);
  check_launch("cuda::engram_gate");
}

}  // namespace dsv41::cuda
