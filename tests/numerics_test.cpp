// Tests of src/numerics. Expected values come from the OCP definitions, computed here in double
// from the bit fields or by brute-force search over every representable value, never from the code
// under test. Comparisons are exact (bit for bit) unless a test says otherwise and why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "base/error.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// ---- Independent models of the formats ----

// OCP e4m3 "fn": S.EEEE.MMM, bias 7; exponent 0 is subnormal, m * 2^-9; S.1111.111 is NaN.
double ocp_e4m3(int code) {
  const int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return kNaN;
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

// OCP e2m1: S.EE.M, bias 1; exponent 0 is subnormal, m * 0.5.
double ocp_e2m1(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double magnitude = e == 0 ? 0.5 * m : std::ldexp(2 + m, e - 2);
  return (code & 0x8) ? -magnitude : magnitude;
}

// The code among 0..max_code (nonnegative values, increasing with the code) nearest to |v|, ties
// to the even code (the code's last bit is the mantissa's last bit), |v| above the largest value
// saturating; the sign bit `sign_bit` is set for negative v (and -0).
template <typename Value>
int nearest_code(double v, int max_code, int sign_bit, Value value) {
  const double a = std::min(std::fabs(v), value(max_code));
  int best = 0;
  for (int c = 1; c <= max_code; ++c) {
    const double d = std::fabs(a - value(c)), best_d = std::fabs(a - value(best));
    if (d < best_d || (d == best_d && c % 2 == 0)) best = c;
  }
  return std::signbit(v) ? best | sign_bit : best;
}

int nearest_e4m3(double v) { return nearest_code(v, 0x7E, 0x80, ocp_e4m3); }
int nearest_e2m1(double v) { return nearest_code(v, 7, 0x8, ocp_e2m1); }

// Random floats with exponents in [min_exp, max_exp], random mantissa bits, alternating signs.
std::vector<float> sweep(int count, int min_exp, int max_exp, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> exponent(min_exp, max_exp);
  std::uniform_int_distribution<uint32_t> mantissa(0, (1u << 23) - 1);
  std::vector<float> xs;
  for (int i = 0; i < count; ++i) {
    const float x = std::ldexp(1.0f + float(mantissa(rng)) * 0x1p-23f, exponent(rng));
    xs.push_back(i % 2 ? -x : x);
  }
  return xs;
}

std::vector<float> random_vector(int d, float magnitude, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, magnitude);
  std::vector<float> x(d);
  for (float& v : x) v = round_bf16(normal(rng));  // the reference's inputs are bf16
  return x;
}

// ---- e2m1 ----

TEST(NumericsE2M1, AllSixteenCodesDecodeToTheirOcpValue) {
  const double magnitudes[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const double want = (c & 8) ? -magnitudes[c & 7] : magnitudes[c & 7];
    EXPECT_EQ(double(e2m1_to_float(uint8_t(c))), want) << "code " << c;
    EXPECT_EQ(std::signbit(e2m1_to_float(uint8_t(c))), bool(c & 8)) << "code " << c;
  }
}

TEST(NumericsE2M1, TiesRoundToEven) {
  struct Tie {
    float x, below, above, want;
  };
  const Tie ties[] = {{0.25f, 0, 0.5f, 0}, {0.75f, 0.5f, 1, 1}, {1.25f, 1, 1.5f, 1}, {1.75f, 1.5f, 2, 2},
                      {2.5f, 2, 3, 2},     {3.5f, 3, 4, 4},     {5.0f, 4, 6, 4}};
  for (const Tie& t : ties) {
    EXPECT_EQ(e2m1_to_float(e2m1_from_float(t.x)), t.want) << t.x;
    EXPECT_EQ(e2m1_to_float(e2m1_from_float(-t.x)), -t.want) << -t.x;
    // Just off the tie, the nearer neighbour wins.
    EXPECT_EQ(e2m1_to_float(e2m1_from_float(std::nextafter(t.x, 0.0f))), t.below) << t.x;
    EXPECT_EQ(e2m1_to_float(e2m1_from_float(std::nextafter(t.x, 9.0f))), t.above) << t.x;
  }
}

TEST(NumericsE2M1, SaturatesAtSix) {
  EXPECT_EQ(e2m1_from_float(6.5f), 0x7);
  EXPECT_EQ(e2m1_from_float(1e30f), 0x7);
  EXPECT_EQ(e2m1_from_float(std::numeric_limits<float>::infinity()), 0x7);
  EXPECT_EQ(e2m1_from_float(-std::numeric_limits<float>::infinity()), 0xF);
}

TEST(NumericsE2M1, NegativeZeroKeepsItsSign) {
  EXPECT_EQ(e2m1_from_float(0.0f), 0x0);
  EXPECT_EQ(e2m1_from_float(-0.0f), 0x8);
  EXPECT_EQ(e2m1_from_float(-0.1f), 0x8);  // rounds to zero, stays negative
  EXPECT_TRUE(std::signbit(e2m1_to_float(0x8)));
}

TEST(NumericsE2M1, EncodeOfDecodeIsTheIdentityOnAllCodes) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_from_float(e2m1_to_float(uint8_t(c))), c) << c;
}

TEST(NumericsE2M1, EncodeIsTheNearestValueOnASweep) {
  for (float x : sweep(200000, -6, 4, 1)) ASSERT_EQ(e2m1_from_float(x), nearest_e2m1(x)) << x;
  for (int c = 0; c < 7; ++c) {  // every midpoint, and its neighbours
    const float mid = float((ocp_e2m1(c) + ocp_e2m1(c + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 9.0f)})
      EXPECT_EQ(e2m1_from_float(x), nearest_e2m1(x)) << x;
  }
}

// ---- e4m3 ----

TEST(NumericsE4M3, All256CodesDecodeToTheirOcpValue) {
  for (int c = 0; c < 256; ++c) {
    const double want = ocp_e4m3(c);
    const float got = e4m3_to_float(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(double(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);
}

TEST(NumericsE4M3, EncodeOfDecodeIsTheIdentityOnAllCodes) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN codes: checked below
    EXPECT_EQ(e4m3_from_float(e4m3_to_float(uint8_t(c))), c) << c;
  }
  EXPECT_EQ(e4m3_from_float(e4m3_to_float(0x7F)), 0x7F);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::quiet_NaN()), 0x7F);
}

TEST(NumericsE4M3, TiesRoundToEven) {
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(1.0625f)), 1.0f);    // between 1 and 1.125
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(1.1875f)), 1.25f);   // between 1.125 and 1.25
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(432.0f)), 448.0f);   // between 416 and 448
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(400.0f)), 384.0f);   // between 384 and 416
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(-1.0625f)), -1.0f);
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(std::nextafter(1.0625f, 2.0f))), 1.125f);
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(std::nextafter(1.0625f, 0.0f))), 1.0f);
  // Subnormal ties, in units of 2^-9; 7.5 units rounds up into the first normal, 2^-6.
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(0.5f * 0x1p-9f)), 0.0f);
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(1.5f * 0x1p-9f)), 2 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(2.5f * 0x1p-9f)), 2 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(7.5f * 0x1p-9f)), 0x1p-6f);
  EXPECT_EQ(e4m3_to_float(e4m3_from_float(std::nextafter(0.5f * 0x1p-9f, 1.0f))), 0x1p-9f);
}

TEST(NumericsE4M3, SaturatesAt448) {
  for (float x : {449.0f, 464.0f, 479.0f, 480.0f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(e4m3_from_float(x), 0x7E) << x;
    EXPECT_EQ(e4m3_from_float(-x), 0xFE) << -x;
  }
  EXPECT_EQ(e4m3_from_float(-0.0f), 0x80);
  EXPECT_EQ(e4m3_from_float(1e-30f), 0x00);
}

TEST(NumericsE4M3, EncodeIsTheNearestValueOnASweep) {
  for (float x : sweep(200000, -12, 9, 2)) ASSERT_EQ(e4m3_from_float(x), nearest_e4m3(x)) << x;
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = float((ocp_e4m3(c) + ocp_e4m3(c + 1)) / 2);
    for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 500.0f)})
      EXPECT_EQ(e4m3_from_float(x), nearest_e4m3(x)) << x;
  }
}

// ---- bf16 ----

TEST(NumericsBF16, TiesRoundToEven) {
  EXPECT_EQ(bf16_from_float(1.0f + 0x1p-8f), 0x3F80);          // halfway to 1 + 2^-7: stays at 1
  EXPECT_EQ(bf16_from_float(1.0f + 3 * 0x1p-8f), 0x3F82);      // halfway between odd and even: up
  EXPECT_EQ(bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // past halfway: up
  EXPECT_EQ(bf16_from_float(-(1.0f + 0x1p-8f)), 0xBF80);
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);
}

TEST(NumericsBF16, SpecialValues) {
  EXPECT_EQ(bf16_to_float(0x3F80), 1.0f);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()), 0x7F80);  // RNE overflows to infinity
  EXPECT_EQ(bf16_from_float(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_bf16(float_from_bits(0x7F800001u))));  // payload only in the low half
  EXPECT_TRUE(std::isnan(round_bf16(float_from_bits(0xFF800001u))));
}

TEST(NumericsBF16, RoundTripsEveryBF16Value) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float x = bf16_to_float(uint16_t(h));
    if (std::isnan(x)) continue;
    ASSERT_EQ(bf16_from_float(x), h) << h;
  }
}

// Every finite fp32 pattern of a random sweep, and each one's neighbours at the rounding point
// (the halfway pattern and one unit either side), encodes to the nearer of the two bf16 values
// around it, ties to the even code, measured in double; past the largest bf16 value the upper
// neighbour is 2^128, where IEEE rounding puts infinity.
TEST(NumericsBF16, EncodeIsTheNearestValueOnASweep) {
  auto value = [](uint32_t code) {
    const double magnitude = (code & 0x7FFFu) == 0x7F80u ? std::ldexp(1.0, 128) : double(bf16_to_float(uint16_t(code & 0x7FFFu)));
    return code & 0x8000u ? -magnitude : magnitude;
  };
  std::mt19937 rng(7);
  for (int n = 0; n < 200000; ++n) {
    const uint32_t base = rng();
    for (uint32_t bits : {base, (base & 0xFFFF0000u) | 0x8000u, (base & 0xFFFF0000u) | 0x7FFFu, (base & 0xFFFF0000u) | 0x8001u}) {
      const float x = float_from_bits(bits);
      if (std::isnan(x) || std::isinf(x)) continue;
      const uint32_t lo = bits >> 16, hi = lo + 1;  // toward zero and away from it, same sign
      const double below = std::abs(double(x) - value(lo)), above = std::abs(value(hi) - double(x));
      const uint32_t nearest = below < above ? lo : above < below ? hi : (lo & 1u ? hi : lo);
      ASSERT_EQ(bf16_from_float(x), nearest) << std::hex << bits;
    }
  }
}

// ---- ue8m0 and the power-of-two rule ----

TEST(NumericsE8M0, DecodesAndEncodesEveryCode) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  for (int e = 0; e < 255; ++e) {
    EXPECT_EQ(e8m0_to_float(uint8_t(e)), std::ldexp(1.0f, e - 127)) << e;
    EXPECT_EQ(e8m0_from_pow2(std::ldexp(1.0f, e - 127)), e) << e;
  }
}

TEST(NumericsPow2Ceil, HandComputedCases) {
  EXPECT_EQ(pow2_ceil(1.0f), 1.0f);
  EXPECT_EQ(pow2_ceil(std::nextafter(1.0f, 2.0f)), 2.0f);
  EXPECT_EQ(pow2_ceil(0.75f), 1.0f);
  EXPECT_EQ(pow2_ceil(3.0f), 4.0f);
  EXPECT_EQ(pow2_ceil(0x1p-126f), 0x1p-126f);
  EXPECT_EQ(pow2_ceil(1.5f * 0x1p-126f), 0x1p-125f);
  EXPECT_EQ(pow2_ceil(0x1p127f), 0x1p127f);
}

TEST(NumericsPow2Ceil, IsTheSmallestPowerOfTwoNotBelowX) {
  for (float x : sweep(100000, -126, 126, 3)) {
    const float p = pow2_ceil(std::fabs(x));
    int e;
    ASSERT_EQ(std::frexp(p, &e), 0.5f) << x;  // a power of two
    ASSERT_GE(p, std::fabs(x));
    ASSERT_LT(p / 2, std::fabs(x));
  }
}

// ---- Block scale rules ----

TEST(NumericsScale, MxFp4HandComputed) {
  EXPECT_EQ(mxfp4::block_scale(6.0f), 1.0f);
  EXPECT_EQ(mxfp4::block_scale(6.0001f), 2.0f);
  EXPECT_EQ(mxfp4::block_scale(3.0f), 0.5f);
  EXPECT_EQ(mxfp4::block_scale(12.0f), 2.0f);
  EXPECT_EQ(mxfp4::block_scale(0.0f), 0x1p-126f);  // amax floored at 6 * 2^-126
  EXPECT_EQ(mxfp4::block_scale(1e-40f), 0x1p-126f);
}

TEST(NumericsScale, SwaFp8HandComputed) {
  EXPECT_EQ(swa_fp8::block_scale(448.0f), 1.0f);
  EXPECT_EQ(swa_fp8::block_scale(449.0f), 2.0f);
  EXPECT_EQ(swa_fp8::block_scale(224.0f), 0.5f);
  EXPECT_EQ(swa_fp8::block_scale(1.0f), 0x1p-8f);  // 1/448 lies in (2^-9, 2^-8]
  // amax floored at 1e-4: 1e-4 / 448 = 2^-22.09..., rounded up to 2^-22.
  EXPECT_EQ(swa_fp8::block_scale(0.0f), 0x1p-22f);
}

TEST(NumericsScale, KvFp4HandComputed) {
  EXPECT_EQ(kv_fp4::block_scale(6.0f), 1.0f);
  EXPECT_EQ(kv_fp4::block_scale(6.5f), 1.125f);   // 1.0833 is nearer 1.125 than 1
  EXPECT_EQ(kv_fp4::block_scale(6.375f), 1.0f);   // 1.0625: a tie, to the even mantissa
  EXPECT_EQ(kv_fp4::block_scale(0.0f), 0x1p-9f);  // clamped below at 2^-9
  EXPECT_EQ(kv_fp4::block_scale(0.001f), 0x1p-9f);
  EXPECT_EQ(kv_fp4::block_scale(2688.0f), 448.0f);
  EXPECT_EQ(kv_fp4::block_scale(1e9f), 448.0f);  // clamped above at 448
}

// The kernels multiply amax by the fp32 reciprocal of the format maximum before rounding up. This
// checks, over every float of one binade of amax, that the result still is the exact
// 2^ceil(log2(amax / max)); a power-of-two change of amax scales the product exactly, so one binade
// stands for all normal amax.
TEST(NumericsScale, ReciprocalMultiplyIsExactOverABinade) {
  for (uint32_t m = 0; m < (1u << 23); ++m) {
    const float unit = float_from_bits(0x3F800000u | m);  // every float in [1, 2)
    const float want = m == 0 ? 1.0f : 2.0f;
    ASSERT_EQ(swa_fp8::block_scale(448.0f * unit), want) << unit;
    ASSERT_EQ(mxfp4::block_scale(6.0f * unit), want) << unit;
  }
}

TEST(NumericsScale, KvFp4ScaleIsTheNearestE4M3OfAmaxOverSix) {
  for (float x : sweep(20000, -9, 12, 4)) {
    const float amax = std::fabs(x);
    const float ratio = std::min(std::max(amax, 6 * 0x1p-9f) / 6.0f, 448.0f);
    ASSERT_EQ(kv_fp4::block_scale(amax), float(ocp_e4m3(nearest_e4m3(ratio)))) << amax;
  }
}

// ---- Byte layouts ----

TEST(NumericsLayout, ByteSizes) {
  static_assert(kv_fp4::bytes(512) == 288);
  static_assert(mxfp4::bytes(128) == 68);
  static_assert(swa_fp8::bytes(512) == 528);
  static_assert(kv_fp4::scales_offset(512) == 256);
  static_assert(mxfp4::scales_offset(128) == 64);
  static_assert(swa_fp8::scales_offset(512) == 512);
  static_assert(fp8_weight_scale_count(512, 5120) == 16 * 160);
  static_assert(fp4_weight_bytes(2304, 5120) == 2304 * 2560);  // docs/formats.md example
  static_assert(fp4_weight_scale_count(2304, 5120) == 2304 * 160);
  SUCCEED();
}

TEST(NumericsLayout, NibbleOrderIsEvenElementLow) {
  // One MXFP4 block with amax 6 (scale 1): element 0 = 1.0 (code 2), element 1 = -2.0 (code 0xC).
  std::vector<float> x(32, 0.0f);
  x[0] = 1.0f, x[1] = -2.0f, x[2] = 6.0f, x[3] = 0.5f;
  std::vector<uint8_t> out(mxfp4::bytes(32));
  mxfp4::encode(x.data(), 32, out.data());
  EXPECT_EQ(out[0], 0xC2);
  EXPECT_EQ(out[1], 0x17);
  for (int i = 2; i < 16; ++i) EXPECT_EQ(out[i], 0x00) << i;
  EXPECT_EQ(out[16], 127);  // the ue8m0 scale 2^0 after the 16 nibble bytes
}

TEST(NumericsLayout, KvFp4EntryIsNibblesThenE4M3Scales) {
  // Two blocks: the first with amax 6 (scale 1.0 = e4m3 0x38), the second with amax 12 (2.0 = 0x40).
  std::vector<float> x(32, 0.0f);
  x[0] = 3.0f, x[1] = 6.0f;     // codes 5, 7
  x[16] = 12.0f, x[17] = -1.0f;  // 12/2 = 6 -> 7; -1/2 = -0.5 -> 0x9
  std::vector<uint8_t> out(kv_fp4::bytes(32));
  ASSERT_EQ(out.size(), 18u);
  kv_fp4::encode(x.data(), 32, out.data());
  EXPECT_EQ(out[0], 0x75);
  EXPECT_EQ(out[8], 0x97);
  EXPECT_EQ(out[16], 0x38);
  EXPECT_EQ(out[17], 0x40);
}

TEST(NumericsLayout, SwaFp8EntryIsBytesThenUe8m0Scales) {
  std::vector<float> x(64, 0.0f);
  x[0] = 448.0f, x[1] = -1.0f;  // scale 1: codes 0x7E, 0xB8
  x[32] = 896.0f;               // scale 2: code 0x7E
  std::vector<uint8_t> out(swa_fp8::bytes(64));
  swa_fp8::encode(x.data(), 64, out.data());
  EXPECT_EQ(out[0], 0x7E);
  EXPECT_EQ(out[1], 0xB8);
  EXPECT_EQ(out[32], 0x7E);
  EXPECT_EQ(out[64], 127);
  EXPECT_EQ(out[65], 128);
}

// ---- Codecs ----

TEST(NumericsKvFp4, MaximumMagnitudeIs2688) {
  EXPECT_EQ(kv_fp4::kMaxMagnitude, 2688.0f);
  std::vector<float> x(16, 1.0f);
  x[3] = 1e9f, x[4] = -5000.0f;
  kv_fp4::quantize_dequantize(x.data(), 16);
  EXPECT_EQ(x[3], 2688.0f);
  EXPECT_EQ(x[4], -2688.0f);  // -5000/448 saturates at -6

  std::vector<float> y(16, 0.0f);
  y[7] = 2688.0f;
  std::vector<uint8_t> entry(kv_fp4::bytes(16));
  kv_fp4::encode(y.data(), 16, entry.data());
  std::vector<float> back(16);
  kv_fp4::decode(entry.data(), 16, back.data());
  EXPECT_EQ(back, y);
}

// The codec's fake quantization against a model built here from the rule text: scale by the stated
// rule, nearest element value by brute force, multiply back.
TEST(NumericsKvFp4, QuantizeDequantizeMatchesTheRule) {
  for (float magnitude : {1e-4f, 0.01f, 1.0f, 30.0f, 1000.0f}) {
    const std::vector<float> x = random_vector(512, magnitude, 5);
    std::vector<float> y = x;
    kv_fp4::quantize_dequantize(y.data(), 512);
    for (int b = 0; b < 512; b += 16) {
      float amax = 0;
      for (int i = b; i < b + 16; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float ratio = std::min(std::max(amax, 6 * 0x1p-9f) / 6.0f, 448.0f);
      const float scale = float(ocp_e4m3(nearest_e4m3(ratio)));
      for (int i = b; i < b + 16; ++i)
        ASSERT_EQ(y[i], float(ocp_e2m1(nearest_e2m1(x[i] / scale))) * scale) << magnitude << " " << i;
    }
  }
}

TEST(NumericsMxFp4, QuantizeDequantizeMatchesTheRule) {
  for (float magnitude : {1e-30f, 1e-3f, 1.0f, 100.0f, 1e20f}) {
    const std::vector<float> x = random_vector(128, magnitude, 6);
    std::vector<float> y = x;
    mxfp4::quantize_dequantize(y.data(), 128);
    for (int b = 0; b < 128; b += 32) {
      double amax = 0;
      for (int i = b; i < b + 32; ++i) amax = std::max(amax, double(std::fabs(x[i])));
      amax = std::max(amax, 6 * 0x1p-126);
      const double scale = std::exp2(std::ceil(std::log2(amax / 6)));  // exact in double here
      for (int i = b; i < b + 32; ++i)
        ASSERT_EQ(double(y[i]), ocp_e2m1(nearest_e2m1(x[i] / scale)) * scale) << magnitude << " " << i;
    }
  }
}

TEST(NumericsSwaFp8, QuantizeDequantizeMatchesTheRule) {
  for (float magnitude : {1e-6f, 1e-3f, 1.0f, 100.0f, 1e6f}) {
    const std::vector<float> x = random_vector(512, magnitude, 7);
    std::vector<float> y = x;
    swa_fp8::quantize_dequantize(y.data(), 512);
    for (int b = 0; b < 512; b += 32) {
      double amax = 1e-4f;
      for (int i = b; i < b + 32; ++i) amax = std::max(amax, double(std::fabs(x[i])));
      const double scale = std::exp2(std::ceil(std::log2(amax / 448)));
      for (int i = b; i < b + 32; ++i)
        ASSERT_EQ(double(y[i]), ocp_e4m3(nearest_e4m3(x[i] / scale)) * scale) << magnitude << " " << i;
    }
  }
}

TEST(NumericsCodecs, QuantizeDequantizeEqualsDecodeOfEncode) {
  const std::vector<float> x = random_vector(512, 3.0f, 8);
  std::vector<uint8_t> entry(swa_fp8::bytes(512));
  std::vector<float> decoded(512), fake(512);

  kv_fp4::encode(x.data(), 512, entry.data());
  kv_fp4::decode(entry.data(), 512, decoded.data());
  fake = x;
  kv_fp4::quantize_dequantize(fake.data(), 512);
  EXPECT_EQ(decoded, fake);

  mxfp4::encode(x.data(), 512, entry.data());
  mxfp4::decode(entry.data(), 512, decoded.data());
  fake = x;
  mxfp4::quantize_dequantize(fake.data(), 512);
  EXPECT_EQ(decoded, fake);

  swa_fp8::encode(x.data(), 512, entry.data());
  swa_fp8::decode(entry.data(), 512, decoded.data());
  fake = x;
  swa_fp8::quantize_dequantize(fake.data(), 512);
  EXPECT_EQ(decoded, fake);
}

TEST(NumericsCodecs, QuantizeDequantizeIsIdempotent) {
  // A second pass finds the same amax (the element that set it is reproduced exactly, since the
  // scale makes it land on a representable value or below), so nothing moves.
  std::vector<float> x = random_vector(512, 3.0f, 9);
  swa_fp8::quantize_dequantize(x.data(), 512);
  std::vector<float> again = x;
  swa_fp8::quantize_dequantize(again.data(), 512);
  EXPECT_EQ(again, x);
  x = random_vector(512, 3.0f, 10);
  mxfp4::quantize_dequantize(x.data(), 512);
  again = x;
  mxfp4::quantize_dequantize(again.data(), 512);
  EXPECT_EQ(again, x);
}

TEST(NumericsCodecs, DequantizedValuesAreExactInBF16) {
  std::vector<float> x = random_vector(512, 3.0f, 11);
  kv_fp4::quantize_dequantize(x.data(), 512);
  for (float v : x) EXPECT_EQ(round_bf16(v), v);
  x = random_vector(512, 1e-3f, 12);
  swa_fp8::quantize_dequantize(x.data(), 512);
  for (float v : x) EXPECT_EQ(round_bf16(v), v);
}

TEST(NumericsCodecs, ActQuantFp8IsTheSwaRulePerBlock) {
  const std::vector<float> x = random_vector(256, 5.0f, 13);
  std::vector<float> a = x, b = x;
  act_quant_fp8(a.data(), 256, 32);
  swa_fp8::quantize_dequantize(b.data(), 256);
  EXPECT_EQ(a, b);
  // Block 128: one scale over 128 values, from the largest of them.
  std::vector<float> c(128, 1.0f);
  c[100] = 448.0f * 4;  // scale 4: 1.0 / 4 = 0.25 is an e4m3 value
  c[5] = 1.01f;
  act_quant_fp8(c.data(), 128, 128);
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[5], 1.0f);  // 1.01 / 4 = 0.2525 -> e4m3 0.25 (step 2^-5 there)
  EXPECT_EQ(c[100], 1792.0f);
}

TEST(NumericsCodecs, BadLengthsThrow) {
  std::vector<float> x(64, 1.0f);
  std::vector<uint8_t> out(128);
  EXPECT_THROW(kv_fp4::encode(x.data(), 17, out.data()), Error);
  EXPECT_THROW(kv_fp4::decode(out.data(), 0, x.data()), Error);
  EXPECT_THROW(mxfp4::encode(x.data(), 48, out.data()), Error);
  EXPECT_THROW(swa_fp8::quantize_dequantize(x.data(), 31), Error);
  EXPECT_THROW(act_quant_fp8(x.data(), 64, 0), Error);
  EXPECT_THROW(quantize_fp4_weight(x.data(), 2, 16, out.data(), out.data()), Error);
  EXPECT_NO_THROW(kv_fp4::encode(x.data(), 16, out.data()));
}

// ---- Weights ----

// e4m3 keeps 4 significant bits, so a normal element is within half a step, |w| * 2^-4; below the
// normal range (|w| < 2^-6 * scale) the step is 2^-9 * scale, so the error is at most 2^-10 * scale.
// Rounding the scale up means nothing saturates, so these bounds hold for every element.
TEST(NumericsWeights, Fp8RoundTripErrorIsWithinHalfAStep) {
  const int out = 70, in = 100;  // partial edge blocks in both directions
  std::vector<float> w = random_vector(out * in, 0.02f, 14);
  w[5] = 0.0f;
  std::vector<uint8_t> q(out * in), scales(fp8_weight_scale_count(out, in));
  ASSERT_EQ(scales.size(), 3u * 4u);
  quantize_fp8_weight(w.data(), out, in, q.data(), scales.data());
  std::vector<float> back(out * in);
  dequantize_fp8_weight(q.data(), scales.data(), out, in, back.data());
  for (int r = 0; r < out; ++r) {
    for (int c = 0; c < in; ++c) {
      const float scale = e8m0_to_float(scales[(r / 32) * 4 + c / 32]);
      const float v = w[r * in + c], bound = std::max(std::fabs(v) * 0x1p-4f, scale * 0x1p-10f);
      ASSERT_LE(std::fabs(back[r * in + c] - v), bound) << r << " " << c;
    }
  }
  EXPECT_EQ(back[5], 0.0f);
}

TEST(NumericsWeights, Fp8ScaleIsPer32x32Block) {
  const int out = 70, in = 100;
  std::vector<float> w = random_vector(out * in, 0.02f, 15);
  std::vector<uint8_t> q(out * in), before(fp8_weight_scale_count(out, in)), after(before.size());
  quantize_fp8_weight(w.data(), out, in, q.data(), before.data());
  w[40 * in + 70] = 100.0f;  // row block 1, column block 2
  quantize_fp8_weight(w.data(), out, in, q.data(), after.data());
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (i == 1 * 4 + 2)
      EXPECT_EQ(e8m0_to_float(after[i]), 0.25f);  // 100 / 448 rounded up to a power of two
    else
      EXPECT_EQ(after[i], before[i]) << i;
  }
}

TEST(NumericsWeights, Fp8ZeroBlockGetsAValidScale) {
  std::vector<float> w(32 * 32, 0.0f);
  std::vector<uint8_t> q(w.size()), scales(1);
  quantize_fp8_weight(w.data(), 32, 32, q.data(), scales.data());
  EXPECT_EQ(scales[0], 1);  // 2^-126, the floor 448 * 2^-126 over 448
  for (uint8_t b : q) EXPECT_EQ(b, 0);
}

// e2m1 steps are 0.5 below 2, 1 up to 4 and 2 up to 6: half a step is at most a quarter of the
// element for |q| >= 1, and at most 0.25 * scale below that.
TEST(NumericsWeights, Fp4RoundTripErrorIsWithinHalfAStep) {
  const int out = 33, in = 96;
  std::vector<float> w = random_vector(out * in, 0.02f, 16);
  std::vector<uint8_t> q(fp4_weight_bytes(out, in)), scales(fp4_weight_scale_count(out, in));
  quantize_fp4_weight(w.data(), out, in, q.data(), scales.data());
  std::vector<float> back(out * in);
  dequantize_fp4_weight(q.data(), scales.data(), out, in, back.data());
  for (int r = 0; r < out; ++r) {
    for (int c = 0; c < in; ++c) {
      const float scale = e8m0_to_float(scales[r * 3 + c / 32]);
      const float v = w[r * in + c], bound = 0.25f * std::max(std::fabs(v), scale);
      ASSERT_LE(std::fabs(back[r * in + c] - v), bound) << r << " " << c;
    }
  }
}

TEST(NumericsWeights, Fp4RowsAreMxFp4Vectors) {
  // A row of the fp4 weight carries the same nibbles and scales as an MXFP4 entry of that row.
  const int out = 4, in = 64;
  const std::vector<float> w = random_vector(out * in, 1.0f, 17);
  std::vector<uint8_t> q(fp4_weight_bytes(out, in)), scales(fp4_weight_scale_count(out, in));
  quantize_fp4_weight(w.data(), out, in, q.data(), scales.data());
  for (int r = 0; r < out; ++r) {
    std::vector<uint8_t> entry(mxfp4::bytes(in));
    mxfp4::encode(w.data() + r * in, in, entry.data());
    for (int i = 0; i < in / 2; ++i) EXPECT_EQ(q[r * in / 2 + i], entry[i]) << r << " " << i;
    for (int b = 0; b < 2; ++b) EXPECT_EQ(scales[r * 2 + b], entry[in / 2 + b]) << r << " " << b;
  }
}

TEST(NumericsWeights, Fp4ScaleIsPerRowAnd32AlongK) {
  const int out = 8, in = 128;
  std::vector<float> w = random_vector(out * in, 0.02f, 18);
  std::vector<uint8_t> q(fp4_weight_bytes(out, in)), before(fp4_weight_scale_count(out, in)), after(before.size());
  quantize_fp4_weight(w.data(), out, in, q.data(), before.data());
  w[5 * in + 70] = 12.0f;  // row 5, block 2
  quantize_fp4_weight(w.data(), out, in, q.data(), after.data());
  for (std::size_t i = 0; i < before.size(); ++i) {
    if (i == 5 * 4 + 2)
      EXPECT_EQ(e8m0_to_float(after[i]), 2.0f);
    else
      EXPECT_EQ(after[i], before[i]) << i;
  }
}

TEST(NumericsWeights, RepresentableWeightsRoundTripExactly) {
  // Every e4m3 value times a power of two survives quantization unchanged when the block's amax
  // is exactly 448 times that power.
  std::vector<float> w(32 * 32);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = e4m3_to_float(uint8_t(i % 0x7F)) * 0x1p-10f;
  w[0] = 448.0f * 0x1p-10f;
  std::vector<uint8_t> q(w.size()), scales(1);
  quantize_fp8_weight(w.data(), 32, 32, q.data(), scales.data());
  std::vector<float> back(w.size());
  dequantize_fp8_weight(q.data(), scales.data(), 32, 32, back.data());
  EXPECT_EQ(back, w);
}

}  // namespace
}  // namespace dsv41
