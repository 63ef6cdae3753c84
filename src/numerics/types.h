#pragma once
// The scalar element types of DeepSeek-V4.1: bf16, fp8 e4m3 ("fn"), fp4 e2m1 and the ue8m0 scale.
//
// Every conversion is written on the IEEE-754 bits with integer arithmetic only, so it gives the
// same answer on the host and in a CUDA kernel and does not depend on the floating-point rounding
// mode. All encoders round to nearest, ties to even (RNE). docs/formats.md gives the bit layouts.
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define DSV41_HD __host__ __device__
#else
#define DSV41_HD
#endif

namespace dsv41 {

inline constexpr float kE4M3Max = 448.0f;  // S.1111.110
inline constexpr float kE2M1Max = 6.0f;    // S.11.1

DSV41_HD inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

DSV41_HD inline float float_from_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// Decided on the bits so that it survives -ffast-math and --use_fast_math.
DSV41_HD inline bool is_nan(float x) { return (float_bits(x) & 0x7FFFFFFFu) > 0x7F800000u; }

namespace detail {

// x / 2^s rounded to nearest, ties to even; 1 <= s <= 31 and x + 2^(s-1) below 2^32 (a NaN's
// bits may wrap: bf16_from_float discards that result). Adding half - 1, plus one more when the
// kept part is odd, carries into the kept part exactly when the dropped part is above half, or at
// half with an odd kept part. No branch: a kernel that rounds a row runs this per element, where
// the compare-and-select form took twice the instructions.
DSV41_HD inline uint32_t shift_right_rne(uint32_t x, int s) {
  return (x + ((1u << (s - 1)) - 1u) + ((x >> s) & 1u)) >> s;
}

// The magnitude code (exponent field, then mantissa field) of the value nearest to the fp32 number
// with bits `bits`, in a small float format with M mantissa bits and exponent bias B. The number must
// be nonnegative, finite, and not above the format's largest value: callers saturate first.
//
// Normal results keep the top M mantissa bits of the fp32 number, so rounding is one RNE shift of the
// whole bit pattern; a carry out of the mantissa lands in the exponent field, which is exactly the
// next binade. Below the smallest normal the format counts in units of 2^(1-B-M), and the fp32
// significand (hidden bit included) is shifted to that unit; a result of 2^M there is the smallest
// normal code, so the two ranges meet without a special case.
template <int M, int B>
DSV41_HD inline uint32_t small_float_code(uint32_t bits) {
  const int exponent = int(bits >> 23) - 127 + B;  // biased exponent in the small format
  if (exponent >= 1) return shift_right_rne(bits, 23 - M) - (uint32_t(127 - B) << M);
  const int shift = 23 - M + 1 - exponent;
  if (shift > 24) return 0;  // below half the smallest subnormal (fp32 zero and subnormals too)
  return shift_right_rne((bits & 0x7FFFFFu) | 0x800000u, shift);
}

// The nonnegative value of magnitude code `code` in that format (no NaN handling).
template <int M, int B>
DSV41_HD inline float small_float_value(uint32_t code) {
  const uint32_t exponent = code >> M;
  const uint32_t mantissa = code & ((1u << M) - 1u);
  if (exponent == 0) return float(mantissa) * float_from_bits(uint32_t(127 + 1 - B - M) << 23);
  return float_from_bits(((exponent + 127 - B) << 23) | (mantissa << (23 - M)));
}

DSV41_HD inline float with_sign(float magnitude, bool negative) {
  return float_from_bits(float_bits(magnitude) | (negative ? 0x80000000u : 0u));
}

}  // namespace detail

// ---- bf16: the top half of an fp32 -----------------------------------------------------------

DSV41_HD inline uint16_t bf16_from_float(float x) {
  const uint32_t bits = float_bits(x);
  // Truncating a NaN whose payload sits in the low half would give infinity, so set the quiet bit.
  // (NVIDIA's conversion returns one canonical NaN instead; either is a NaN.)
  const uint16_t rounded = uint16_t(detail::shift_right_rne(bits, 16));  // overflow rounds to infinity, as IEEE says
  return is_nan(x) ? uint16_t((bits >> 16) | 0x0040u) : rounded;
}

DSV41_HD inline float bf16_to_float(uint16_t h) { return float_from_bits(uint32_t(h) << 16); }

DSV41_HD inline float round_bf16(float x) { return bf16_to_float(bf16_from_float(x)); }

// ---- e4m3 (OCP "fn"): S.EEEE.MMM, bias 7, no infinity, S.1111.111 = NaN, max 448 ------------------

// Finite values beyond ±448, and infinities, saturate to ±448. torch's own cast would give NaN from
// 480 up, but every DeepSeek caller clamps to ±448 before casting (and the CUDA kernels convert with
// satfinite), so saturation is what the reference computes. NaN encodes as 0x7F, as satfinite does.
DSV41_HD inline uint8_t e4m3_from_float(float x) {
  if (is_nan(x)) return 0x7F;
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  float magnitude = float_from_bits(bits & 0x7FFFFFFFu);
  if (magnitude > kE4M3Max) magnitude = kE4M3Max;
  return uint8_t(sign | detail::small_float_code<3, 7>(float_bits(magnitude)));
}

DSV41_HD inline float e4m3_to_float(uint8_t code) {
  if ((code & 0x7F) == 0x7F) return float_from_bits(0x7FC00000u);
  return detail::with_sign(detail::small_float_value<3, 7>(code & 0x7Fu), code & 0x80);
}

// ---- e2m1 (OCP fp4): S.EE.M, bias 1, codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; no NaN, no infinity ---

// Saturates to ±6. The sign bit is always kept, so -0 and negatives that round to zero give 0x8
// (decoding to -0.0), as both the torch port and NVIDIA's conversion do. NaN has no code; it becomes
// a zero of its own sign, as in the torch port (NVIDIA's conversion gives +6 instead).
DSV41_HD inline uint8_t e2m1_from_float(float x) {
  const uint32_t bits = float_bits(x);
  const uint32_t sign = (bits >> 28) & 0x8u;
  if (is_nan(x)) return uint8_t(sign);
  float magnitude = float_from_bits(bits & 0x7FFFFFFFu);
  if (magnitude > kE2M1Max) magnitude = kE2M1Max;
  return uint8_t(sign | detail::small_float_code<1, 1>(float_bits(magnitude)));
}

// Only the low 4 bits of `nibble` are read.
DSV41_HD inline float e2m1_to_float(uint8_t nibble) {
  return detail::with_sign(detail::small_float_value<1, 1>(nibble & 0x7u), nibble & 0x8);
}

// ---- ue8m0: an unsigned power of two, 2^(e-127); 255 = NaN; no zero -----------------------------

// The fp32 exponent field is the code, but for 0 (2^-127, an fp32 subnormal) and 255 (NaN); as
// selects, not branches: the GEMV kernels decode a scale per 16 or 32 weight codes.
DSV41_HD inline float e8m0_to_float(uint8_t e) {
  const uint32_t bits = uint32_t(e) << 23;
  return float_from_bits(e == 0 ? 0x00400000u : e == 255 ? 0x7FC00000u : bits);
}

// `p` must be a power of two in [2^-127, 2^127]. Its fp32 exponent field is then the ue8m0 code,
// 2^-127 (exponent field 0) included; NaN gives 255.
DSV41_HD inline uint8_t e8m0_from_pow2(float p) { return uint8_t((float_bits(p) >> 23) & 0xFFu); }

// 2^ceil(log2 x) for x > 0, exact: the exponent, plus one when any mantissa bit is set. This is the
// reference's scale rounding (kernel.py fast_round_scale), and like it, it returns 2^-126 for fp32
// subnormal x, 0 for x = 0, and infinity above 2^127. NaN stays NaN.
DSV41_HD inline float pow2_ceil(float x) {
  if (is_nan(x)) return x;
  const uint32_t bits = float_bits(x) & 0x7FFFFFFFu;
  const uint32_t round_up = (bits & 0x7FFFFFu) != 0 ? 1u : 0u;
  return float_from_bits(((bits >> 23) + round_up) << 23);
}

}  // namespace dsv41
