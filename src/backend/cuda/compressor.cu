// Compressor pooling and the KV-FP4 / MXFP4 / SWA-FP8 cache encoders.
//
// pool_kernel: one thread per (group, channel); it walks the group's m rows in the CPU op's order
// (max, sum of exp, weighted sum), reading each score twice and each kv once: coalesced across the
// channels of a warp. Traffic: 2·groups·m·d·4 bytes in (the second score read from L1/L2),
// groups·d·4 out; V4.1 at m = 2, d = 512: 8 KB in per group. Results differ from the CPU's only by
// expf's last bit.
//
// encode_kernel: one warp per entry, one lane per block of the codec (16 values for KV-FP4, 32 for
// MXFP4; 32 and 4 blocks per entry at d = 512 and 128). A lane computes its block's amax and scale
// with the codecs' own scalar functions and writes its packed nibbles and its scale byte, so the
// bytes are the CPU encoder's. The entries go to one array, or each to its own listed destination
// (a decode step's new entry at its cache's end, or nowhere when its group is still open).
// Traffic: d·4 bytes in, bytes(d) out per entry (2 KB → 288 B).
#include "backend/cuda/compressor.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

// One channel of dsv41::pool_group: the m rows of kv and score `d` apart, from channel c.
__device__ float pool_channel(const float* v, const float* s, int m, int64_t d, bool round) {
  float mx = -INFINITY;
  for (int t = 0; t < m; ++t) mx = mx < s[t * d] ? s[t * d] : mx;  // std::max
  float sum = 0;
  for (int t = 0; t < m; ++t) sum += expf(s[t * d] - mx);
  float acc = 0;
  for (int t = 0; t < m; ++t) acc += v[t * d] * (expf(s[t * d] - mx) / sum);
  return round ? round_bf16(acc) : acc;
}

__global__ void pool_kernel(const float* kv, const float* score, int64_t groups, int m, int d, bool round, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= groups * d) return;
  const int64_t g = i / d, c = i % d;
  out[i] = pool_channel(kv + g * m * d + c, score + g * m * d + c, m, d, round);
}

// One thread per (sequence, channel): the thread that appends channel c of the sequence's new row
// is the one that pools channel c, so the append needs no barrier. Traffic per sequence: 2·d·4
// bytes in and out for the append, 2·m·d·4 in and d·4 out when the group closes.
__global__ void append_pool_kernel(const float* kv, const float* score, int64_t sequences, float* const* open_kv,
                                   float* const* open_score, const int32_t* open_rows, int m, int d, bool round,
                                   float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= sequences * d) return;
  const int64_t b = i / d, c = i % d;
  const int rows = open_rows[b];
  open_kv[b][int64_t(rows) * d + c] = kv[i];
  open_score[b][int64_t(rows) * d + c] = score[i];
  out[i] = rows + 1 == m ? pool_channel(open_kv[b] + c, open_score[b] + c, m, d, round) : 0.0f;
}

// KV-FP4: e4m3 scale per 16; MXFP4: power-of-two (ue8m0) scale per 32.
struct KvFp4 {
  static constexpr int kBlock = kv_fp4::kBlock;
  __host__ __device__ static constexpr size_t bytes(int d) { return kv_fp4::bytes(d); }
  __device__ static float scale(float amax) { return kv_fp4::block_scale(amax); }
  __device__ static uint8_t store(float scale) { return e4m3_from_float(scale); }
};
struct MxFp4 {
  static constexpr int kBlock = mxfp4::kBlock;
  __host__ __device__ static constexpr size_t bytes(int d) { return mxfp4::bytes(d); }
  __device__ static float scale(float amax) { return mxfp4::block_scale(amax); }
  __device__ static uint8_t store(float scale) { return e8m0_from_pow2(scale); }
};

// Where entry e goes: one array (entry e at e·bytes), or a list of destinations, null for none.
struct Contiguous {
  uint8_t* out;
  __device__ uint8_t* operator()(int64_t e, size_t bytes) const { return out + e * int64_t(bytes); }
};
struct Listed {
  uint8_t* const* out;
  __device__ uint8_t* operator()(int64_t e, size_t) const { return out[e]; }
};

template <typename Codec, typename Dest>
__global__ void encode_kernel(const float* x, int64_t entries, int d, Dest dest) {
  const int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (e >= entries) return;
  const float* xe = x + e * d;
  uint8_t* oe = dest(e, Codec::bytes(d));
  if (!oe) return;
  for (int b = threadIdx.x % 32; b < d / Codec::kBlock; b += 32) {
    const float* v = xe + b * Codec::kBlock;
    float amax = 0.0f;
    for (int i = 0; i < Codec::kBlock; ++i) {
      const float a = v[i] < 0.0f ? -v[i] : v[i];
      amax = a > amax ? a : amax;  // the codecs' block_amax
    }
    const float scale = Codec::scale(amax);
    oe[d / 2 + b] = Codec::store(scale);
    for (int i = 0; i < Codec::kBlock / 2; ++i)
      oe[b * Codec::kBlock / 2 + i] = uint8_t(e2m1_from_float(v[2 * i] / scale) | (e2m1_from_float(v[2 * i + 1] / scale) << 4));
  }
}

template <typename Codec, typename Dest>
void encode(const char* name, const float* x, int64_t entries, int d, Dest dest, cudaStream_t stream) {
  if (entries <= 0) return;
  if (d <= 0 || d % Codec::kBlock != 0)
    fail(name, "a length that is a positive multiple of " + std::to_string(Codec::kBlock), "d = " + std::to_string(d));
  constexpr int kThreads = 256;
  encode_kernel<Codec><<<unsigned((entries * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, entries, d, dest);
  check_launch(name);
}

// SWA-FP8: one warp per entry, 16 values a lane, so a 32-value block is two neighbouring lanes
// (its amax by one shuffle) and a lane's codes are one 16-byte store. x / scale is x times the
// exact reciprocal of the power-of-two scale, rounded by the hardware's e4m3 conversion: the
// CPU encoder's codes (numerics_test). Each entry to its own destination (a ring slot, or a row
// of a forward call's window buffer). Traffic: d·4 bytes in, bytes(d) out per entry (2 KB → 528 B
// at d = 512).
__global__ void swa_fp8_encode_kernel(const float* x, int64_t entries, int d, uint8_t* const* out) {
  const int64_t e = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (e >= entries) return;  // a whole warp: e is the warp's
  const int lane = int(threadIdx.x % 32), halves = d / 16;
  const float* xe = x + e * d;
  uint8_t* oe = out[e];
  const bool aligned = reinterpret_cast<uintptr_t>(oe) % 16 == 0;
  for (int h0 = 0; h0 < halves; h0 += 32) {  // the same trip count in every lane: the shuffle stays whole
    const int h = h0 + lane;
    const bool on = h < halves;
    float v[16] = {};
    if (on)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float4 f = reinterpret_cast<const float4*>(xe + 16 * h)[q];
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
      }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
    if (!on) continue;
    const float scale = swa_fp8::block_scale(amax), inv = 1.0f / scale;  // a power of two: inv is exact
    uint32_t words[4];
#pragma unroll
    for (int w = 0; w < 4; ++w)
      words[w] = uint32_t(e4m3x2_codes(v[4 * w] * inv, v[4 * w + 1] * inv)) |
                 uint32_t(e4m3x2_codes(v[4 * w + 2] * inv, v[4 * w + 3] * inv)) << 16;
    uint8_t* codes = oe + 16 * h;
    if (aligned) {
      *reinterpret_cast<uint4*>(codes) = make_uint4(words[0], words[1], words[2], words[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) codes[i] = uint8_t(words[i / 4] >> (8 * (i % 4)));
    }
    if (h % 2 == 0) oe[swa_fp8::scales_offset(d) + h / 2] = e8m0_from_pow2(scale);
  }
}

}  // namespace

void pool_groups(const float* kv, const float* score, int64_t groups, int m, int d, bool round, float* out,
                 cudaStream_t stream) {
  if (groups <= 0 || d <= 0) return;
  if (m <= 0) fail("cuda::pool_groups", "a positive group size", std::to_string(m));
  const int64_t n = groups * d;
  pool_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(kv, score, groups, m, d, round, out);
  check_launch("cuda::pool_groups");
}

void append_pool(const float* kv, const float* score, int64_t sequences, float* const* open_kv, float* const* open_score,
                 const int32_t* open_rows, int m, int d, bool round, float* out, cudaStream_t stream) {
  if (sequences <= 0 || d <= 0) return;
  if (m <= 0) fail("cuda::append_pool", "a positive group size", std::to_string(m));
  const int64_t n = sequences * d;
  append_pool_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(kv, score, sequences, open_kv, open_score, open_rows,
                                                                     m, d, round, out);
  check_launch("cuda::append_pool");
}

void kv_fp4_encode(const float* x, int64_t entries, int d, uint8_t* out, cudaStream_t stream) {
  encode<KvFp4>("cuda::kv_fp4_encode", x, entries, d, Contiguous{out}, stream);
}

void kv_fp4_encode(const float* x, int64_t entries, int d, uint8_t* const* out, cudaStream_t stream) {
  encode<KvFp4>("cuda::kv_fp4_encode", x, entries, d, Listed{out}, stream);
}

void mxfp4_encode(const float* x, int64_t entries, int d, uint8_t* out, cudaStream_t stream) {
  encode<MxFp4>("cuda::mxfp4_encode", x, entries, d, Contiguous{out}, stream);
}

void mxfp4_encode(const float* x, int64_t entries, int d, uint8_t* const* out, cudaStream_t stream) {
  encode<MxFp4>("cuda::mxfp4_encode", x, entries, d, Listed{out}, stream);
}

void swa_fp8_encode(const float* x, int64_t entries, int d, uint8_t* const* out, cudaStream_t stream) {
  if (entries <= 0) return;
  if (d <= 0 || d % swa_fp8::kBlock != 0)
    fail("cuda::swa_fp8_encode", "a length that is a positive multiple of 32", "d = " + std::to_string(d));
  constexpr int kThreads = 256;
  swa_fp8_encode_kernel<<<unsigned((entries * 32 + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, entries, d, out);
  check_launch("cuda::swa_fp8_encode");
}

}  // namespace dsv41::cuda
