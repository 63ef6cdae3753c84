#pragma once
// In-register dequantization of e4m3 and e2m1 codes, shared by the kernels that read quantized
// weights and caches.
//
// fp8 and fp4 codes become halves by moving their bits into a half's fields (one permute and
// three integer ops per pair, then a half2→float2 conversion). The half carries the value times a
// fixed power of two (2^-8 for e4m3, whose bias is 7 against the half's 15; 2^-14 for e2m1, bias 1),
// exactly, subnormals included; multiplying by the block's scale and kE4m3Unscale / kE2m1Unscale
// undoes it. e4m3's NaN code (S.1111.111) is not decoded as NaN: no weight or cache holds it, the
// encoders saturate finite values to 448.

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace dsv41::cuda {

inline constexpr float kE4m3Unscale = 0x1p8f;
inline constexpr float kE2m1Unscale = 0x1p14f;

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h) {
  __half2 v;
  memcpy(&v, &h, 4);
  return __half22float2(v);
}

// 4 e4m3 bytes → 4 floats × 2^-8.
__device__ __forceinline__ void e4m3x4(uint32_t word, float* out) {
  const uint32_t lo = __byte_perm(word, 0, 0x4140), hi = __byte_perm(word, 0, 0x4342);  // bytes to 16-bit lanes
  const float2 a = half2_bits_to_float2(((lo & 0x007F007Fu) << 7) | ((lo & 0x00800080u) << 8));
  const float2 b = half2_bits_to_float2(((hi & 0x007F007Fu) << 7) | ((hi & 0x00800080u) << 8));
  out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
}

// 4 bytes of e2m1 pairs (element 2i low nibble) → 8 floats × 2^-14.
__device__ __forceinline__ void e2m1x8(uint32_t word, float* out) {
  const uint32_t lo = word & 0x0F0F0F0Fu, hi = (word >> 4) & 0x0F0F0F0Fu;
  const uint32_t p = __byte_perm(lo, hi, 0x5140), q = __byte_perm(lo, hi, 0x7362);  // nibbles 0-3, 4-7 in order
  const uint32_t lanes[4] = {__byte_perm(p, 0, 0x4140), __byte_perm(p, 0, 0x4342), __byte_perm(q, 0, 0x4140),
                             __byte_perm(q, 0, 0x4342)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = half2_bits_to_float2(((lanes[i] & 0x00070007u) << 9) | ((lanes[i] & 0x00080008u) << 12));
    out[2 * i] = v.x, out[2 * i + 1] = v.y;
  }
}

// Two floats rounded to e4m3 values (round to nearest even, finite values beyond ±448 and
// infinities saturated to ±448), returned as floats: the hardware conversions
// cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2 (sm_89+), one instruction each per pair
// where the integer encoder e4m3_from_float takes ~20. numerics_test checks this against
// e4m3_to_float(e4m3_from_float(v)) for every non-NaN fp32 value.
__device__ __forceinline__ float2 e4m3_round2(float a, float b) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(b), "f"(a));  // a in the low byte
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(codes));  // low byte to the low half
  return half2_bits_to_float2(halves);
}

}  // namespace dsv41::cuda
