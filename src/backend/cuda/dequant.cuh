#pragma once
// In-register dequantization of e4m3 and e2m1 codes, shared by the kernels that read quantized
// weights and caches; the weight stream load and the act-quant's view of x that the GEMV, the
// grouped expert GEMV and the GEMM share.
//
// fp8 and fp4 codes become halves by moving their bits into a half's fields (one permute and
// three integer ops per pair, then a half2→float2 conversion). The half carries the value times a
// fixed power of two (2^-8 for e4m3, whose bias is 7 against the half's 15; 2^-14 for e2m1, bias 1),
// exactly, subnormals included; multiplying by the block's scale and kE4m3Unscale / kE2m1Unscale
// undoes it. The tensor-core kernels' operands go straight to bf16 instead (the last section).
// e4m3's NaN code (S.1111.111) is not decoded as NaN: no weight or cache holds it, the encoders
// saturate finite values to 448.

#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "model/weight.h"
#include "numerics/types.h"

namespace dsv41::cuda {

inline constexpr float kE4m3Unscale = 0x1p8f;
inline constexpr float kE2m1Unscale = 0x1p14f;

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t h) {
  __half2 v;
  memcpy(&v, &h, 4);
  return __half22float2(v);
}

// A 16-byte weight load that skips L1 (each byte is read once).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
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
// e4m3x2_codes gives the two codes themselves (a's in the low byte): e4m3_from_float's, since the
// codes and the values they decode to correspond one to one (NaN aside).
__device__ __forceinline__ uint16_t e4m3x2_codes(float a, float b) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(codes) : "f"(b), "f"(a));  // a in the low byte
  return codes;
}
__device__ __forceinline__ float2 e4m3_round2(float a, float b) {
  const uint16_t codes = e4m3x2_codes(a, b);
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"(codes));  // low byte to the low half
  return half2_bits_to_float2(halves);
}

// The 16-byte chunk of a quantized weight row, decoded to floats in a fixed permutation of its K
// positions; the quantized x is stored in shared memory in the same permutation, as float4 "parts"
// (part p holds the x of decoded slots 4p..4p+3), so each lane's x loads are 16 bytes wide and
// consecutive lanes read consecutive 16 bytes (no bank conflicts). The decode puts each code's
// bits into a half's fields with two shifts and two masks per half2 (exact, subnormals included;
// the half is the value times 2^-8 for e4m3, 2^-14 for e2m1), then converts half2 to float2.
template <WeightFormat F>
struct QFormat;
template <>
struct QFormat<WeightFormat::FP8> {
  static constexpr int kElems = 16;
  static constexpr float kUnscale = kE4m3Unscale;
  // Word j holds K offsets 4j..4j+3 (bytes b0..b3); decoded as (b0, b2), (b1, b3).
  __device__ static void word(uint32_t w, float2& a, float2& b) {
    a = half2_bits_to_float2(((w << 7) & 0x3F803F80u) | ((w << 8) & 0x80008000u));
    b = half2_bits_to_float2(((w >> 1) & 0x3F803F80u) | (w & 0x80008000u));
  }
  // The 8 x values at K offsets 8q..8q+7 of a chunk, as the two parts the decode above reads.
  __device__ static void parts(const float* v, float4& lo, float4& hi) {
    lo = make_float4(v[0], v[2], v[1], v[3]), hi = make_float4(v[4], v[6], v[5], v[7]);
  }
};
template <>
struct QFormat<WeightFormat::FP4> {
  static constexpr int kElems = 32;
  static constexpr float kUnscale = kE2m1Unscale;
  // Word j holds K offsets 8j..8j+7 (nibbles n0..n7, n0 lowest); decoded as (n0, n4), (n1, n5),
  // (n2, n6), (n3, n7): nibble i of a pair sits at bit 4i, its partner 16 bits higher.
  __device__ static void word(uint32_t w, float2& a, float2& b, float2& c, float2& d) {
    a = half2_bits_to_float2(((w << 9) & 0x0E000E00u) | ((w << 12) & 0x80008000u));
    b = half2_bits_to_float2(((w << 5) & 0x0E000E00u) | ((w << 8) & 0x80008000u));
    c = half2_bits_to_float2(((w << 1) & 0x0E000E00u) | ((w << 4) & 0x80008000u));
    d = half2_bits_to_float2(((w >> 3) & 0x0E000E00u) | (w & 0x80008000u));
  }
  __device__ static void parts(const float* v, float4& lo, float4& hi) {
    lo = make_float4(v[0], v[4], v[1], v[5]), hi = make_float4(v[2], v[6], v[3], v[7]);
  }
};

// A weight block's scale, times the format's kUnscale, from its ue8m0 code. The GEMV kernels load
// the codes with their weight chunks, under the same guards, and convert them here where a chunk is
// used: converted inside its guarded block, a code's load is waited for before the next guarded
// load goes out, which made Mega-mHC's norm-weight loads one round trip at a time
// (docs/benchmarks.md, 2026-12-07).
template <WeightFormat F>
__device__ __forceinline__ float weight_scale(uint8_t code) {
  return e8m0_to_float(code) * QFormat<F>::kUnscale;
}

// The activation quantization's view of x (act_quant_fp8 per 32): each lane holds 8 consecutive
// values (zeros where not live), four neighbouring lanes one 32-value block; block_amax8 returns
// the block's amax, load8_block_amax loads the lane's values from x8 first. Every lane of the
// warp must call them (the amax is shuffled among the four).
__device__ __forceinline__ float block_amax8(const float (&v)[8]) {
  float amax = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
  amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
  return fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
}
__device__ __forceinline__ float load8_block_amax(const float* x8, bool live, float (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = 0;
  if (live) {
    const float4 a = *reinterpret_cast<const float4*>(x8);
    const float4 b = *reinterpret_cast<const float4*>(x8 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
  return block_amax8(v);
}

// ---- straight to bf16 (the tensor cores' operands) ----
//
// Every e4m3 or e2m1 value times its power-of-two or e4m3 scale has at most 8 significant bits, so
// it is exact in bf16, and so is a bf16 product of the code's value and the scale: two bf16
// multiplies per four values instead of converting through fp32.

__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// A ue8m0 scale as two bf16, exactly (every power of two of ue8m0 is a bf16).
__device__ __forceinline__ uint32_t pow2_bf16x2(uint32_t e) {
  const uint32_t h = bf16_from_float(e8m0_to_float(uint8_t(e)));
  return h | h << 16;
}

// Values 4h..4h+3 of 8 e2m1 codes (nibble i = value i) as bf16: lo = values 4h, 4h+1, hi = 4h+2,
// 4h+3 (the lower value in the lower half). The magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are bf16
// 0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0: one table of low bytes, one of
// high bytes, indexed by __byte_perm; the sign of value i (bit 3 of its nibble) is the top bit of
// byte i/2 of w (odd i) or of w << 4 (even i), moved to bit 15 of its half by a third one.
template <int H>
__device__ __forceinline__ void e2m1x4_to_bf16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kLow0 = 0xC0800000u, kLow1 = 0xC0804000u, kHigh0 = 0x3F3F3F00u, kHigh1 = 0x40404040u;
  const uint32_t mag = (H == 0 ? w : w >> 16) & 0x7777u;
  const uint32_t low = __byte_perm(kLow0, kLow1, mag), high = __byte_perm(kHigh0, kHigh1, mag);
  const uint32_t up = w << 4;
  constexpr uint32_t b0 = 2 * H, b1 = 2 * H + 1;  // the bytes holding values 4h, 4h+1 and 4h+2, 4h+3
  lo = __byte_perm(low, high, 0x5140u) | (__byte_perm(w, up, b0 << 12 | (4 + b0) << 4) & 0x80008000u);
  hi = __byte_perm(low, high, 0x7362u) | (__byte_perm(w, up, b1 << 12 | (4 + b1) << 4) & 0x80008000u);
}

// ---- bf16 by moving bits (the GEMM's widening) ----
//
// A code's magnitude bits placed in a bf16's exponent and mantissa fields make the bf16 the code's
// value times a fixed power of two, exactly, subnormals included: e4m3's seven (eeee.mmm) at bits
// 10..4 give value · 2^-120 (bias 7 against 127), e2m1's three (ee.m) at bits 8..6 value · 2^-126
// (bias 1; the subnormal 0.5 becomes bf16's subnormal 2^-127). The sign comes from prmt's
// sign-replication mode, which fills a half's high byte with the copied byte's top bit: one prmt,
// one shift and one mask per two values, where the conversions through f16 and f32 take four.
// kE4m3Bits / kE2m1Bits are those powers of two's inverses as bf16x2.
inline constexpr uint32_t kE4m3Bits = 0x7B807B80u;  // 2^120
inline constexpr uint32_t kE2m1Bits = 0x7E807E80u;  // 2^126

// Bytes I and J of w (each with its sign replicated over the byte above it): the halves' pieces.
template <int I, int J>
__device__ __forceinline__ uint32_t prmt_signed(uint32_t w) {
  constexpr uint32_t selector = I | (8 | I) << 4 | J << 8 | (8 | J) << 12;
  uint32_t d;
  asm("prmt.b32 %0, %1, 0, %2;\n" : "=r"(d) : "r"(w), "n"(selector));
  return d;
}

// The e4m3 codes in bytes I, J of w as bf16 · 2^-120 (byte I in the low half).
template <int I, int J>
__device__ __forceinline__ uint32_t e4m3x2_bits(uint32_t w) {
  return (prmt_signed<I, J>(w) << 4) & 0x87F087F0u;
}

// The e2m1 codes in the high nibbles of bytes I, J of w as bf16 · 2^-126 (byte I's in the low
// half); the low nibbles are those of w << 4.
template <int I, int J>
__device__ __forceinline__ uint32_t e2m1x2_bits(uint32_t w) {
  return (prmt_signed<I, J>(w) << 2) & 0x81C081C0u;
}

// The ue8m0 scale 2^(e-127) times 2^120 (e4m3) or 2^126 (e2m1) as bf16x2, for scales below 2 (e <
// 128; from e2m1's e = 129 the product is past bf16's largest power of two, and a caller tells
// e ≥ 128 by its top bit: it multiplies by kE4m3Bits / kE2m1Bits first, then by pow2_bf16x2(e)).
template <bool kE2m1>
__device__ __forceinline__ uint32_t folded_scale_bf16x2(uint32_t e) {
  const uint32_t h = (e + (kE2m1 ? 126u : 120u)) << 7;
  return h | h << 16;
}

// Two e4m3 codes (the low byte first) as two bf16, exactly (e4m3 → f16 → f32 → bf16).
__device__ __forceinline__ uint32_t e4m3x2_to_bf16(uint32_t codes) {
  uint32_t halves;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(uint16_t(codes)));
  const float2 v = half2_bits_to_float2(halves);
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(v.y), "f"(v.x));
  return d;
}

}  // namespace dsv41::cuda
