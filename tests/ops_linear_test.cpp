// Unit tests of src/model/weight.h and linear.h against naive products in double.
//
// The reference (model.py linear, kernel fp8_gemm / fp4_gemm) quantizes the bf16 activation to
// e4m3 per 32 along K with a power-of-two scale (act_quant), multiplies each 32-wide K block in
// fp32 and adds the scaled block partials in K order into an fp32 accumulator; bf16 weights go
// through torch's GEMM (fp32 accumulation). The output is bf16. The naive versions here do the
// quantization with the codecs (tested in numerics_test) and the sum in double, so the only
// difference left is fp32 summation order, which the tolerances below bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"
#include "model/weight.h"
#include "base/error.h"
#include "model/safetensors.h"
#include "numerics/codecs.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::kF32Unit;
using test::make_weight;
using test::OwnedWeight;

// y[m, n] = Σ_k a[m, k] · w[n, k] in double, and for each output the worst-case error of an fp32
// summation of those K products in any order: K · u · Σ_k |a w| (the textbook γ_K bound; the
// products themselves are exact in fp32 for bf16 × bf16 and e4m3 × e4m3/e2m1 values). For the
// random data here it is far below a bf16 ulp of the output; it only matters for outputs that
// cancel to near zero.
struct Naive {
  std::vector<double> y, slack;
};

Naive naive_product(const std::vector<float>& a, int64_t M, const OwnedWeight& w) {
  const int64_t N = w.rows, K = w.cols;
  Naive r;
  r.y.resize(size_t(M * N));
  r.slack.resize(size_t(M * N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0, abs_sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(a[size_t(m * K + k)]) * w.at(n, k);
        sum += p;
        abs_sum += std::fabs(p);
      }
      r.y[size_t(m * N + n)] = sum;
      r.slack[size_t(m * N + n)] = double(K) * kF32Unit * abs_sum;
    }
  return r;
}

// act_quant as model.py's linear applies it in front of an fp8 / fp4 GEMM: per row, blocks of 32.
std::vector<float> act_quant_rows(std::vector<float> x, int64_t M, int64_t K) {
  for (int64_t m = 0; m < M; ++m) act_quant_fp8(x.data() + m * K, int(K), 32);
  return x;
}

// Tolerance: one bf16 ulp of the exact value (the output is rounded to bf16: half an ulp, and an
// fp32 sum that lands on the other side of a rounding midpoint gives the neighbour, one ulp away)
// plus the fp32 summation slack. Also: the naive value rounded to bf16 must be what the op returns
// for at least 99% of the outputs, since a flip needs the fp32 error (~2^-24 relative) to straddle
// a bf16 midpoint (~2^-9 relative): rare.
void expect_bf16_of(const std::vector<float>& y, const Naive& ref, const std::string& what) {
  size_t exact = 0, bad = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double tol = bf16_ulp(ref.y[i]) + ref.slack[i];
    if (std::fabs(double(y[i]) - ref.y[i]) > tol && ++bad <= 5)
      ADD_FAILURE() << what << " output " << i << ": " << y[i] << " vs naive " << ref.y[i] << " (tol " << tol << ")";
    exact += y[i] == round_bf16(float(ref.y[i]));
    if (y[i] != round_bf16(y[i]) && ++bad <= 5) ADD_FAILURE() << what << " output " << i << " is not a bf16 value";
  }
  EXPECT_EQ(bad, 0u) << what;
  EXPECT_GE(double(exact), 0.99 * double(y.size())) << what << ": too many outputs differ from bf16(naive)";
}

// A weight whose magnitude changes by block: rows from 32 on are 64x larger (so an fp8 weight's
// second row block has its own scale) and each 32-column block gets its own factor 2^(b mod 5 - 2),
// so a scale read from the wrong block shows as a power-of-two error.
std::vector<float> blocky_matrix(int rows, int cols, double stddev, uint32_t seed) {
  std::vector<float> w = bf16_normal(size_t(rows) * size_t(cols), stddev, seed);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) w[size_t(r) * cols + c] *= std::ldexp(r >= 32 ? 64.0f : 1.0f, (c / 32) % 5 - 2);
  return w;
}

// Activations whose 32-blocks span magnitudes 2^-6 .. 2^6, so each block's act_quant scale differs.
std::vector<float> blocky_activations(int64_t M, int64_t K, uint32_t seed) {
  std::vector<float> x = bf16_normal(size_t(M * K), 1.0, seed);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) x[size_t(m * K + k)] = round_bf16(std::ldexp(x[size_t(m * K + k)], int((k / 32 + m) % 13) - 6));
  return x;
}

// ---- weight.h ----

// at() and row() give exactly the values the codecs decode (FP8: partial 32x32 edge blocks in both
// dimensions; FP4: element 2c in the low nibble), bf16 bytes little-endian, fp32 as stored.
TEST(OpsWeight, AtAndRowGiveTheDecodedValuesInEveryFormat) {
  const int rows = 45, cols = 96;
  const std::vector<float> w = blocky_matrix(rows, cols, 0.3, 1);
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8, WeightFormat::FP4}) {
    const OwnedWeight o = make_weight(f, w, rows, cols);
    const Weight v = o.view();
    std::vector<float> row(cols);
    for (int r = 0; r < rows; ++r) {
      v.row(r, row.data());
      for (int c = 0; c < cols; ++c) {
        ASSERT_EQ(v.at(r, c), o.at(r, c)) << test::format_name(f) << " (" << r << ", " << c << ")";
        ASSERT_EQ(row[c], o.at(r, c)) << test::format_name(f) << " row " << r << " col " << c;
      }
    }
  }
  // An fp8 matrix with columns not a multiple of 32: the scale tensor has ceil(cols / 32) columns.
  const OwnedWeight o = make_weight(WeightFormat::FP8, blocky_matrix(40, 72, 0.3, 2), 40, 72);
  for (int r = 0; r < 40; ++r)
    for (int c = 0; c < 72; ++c) ASSERT_EQ(o.view().at(r, c), o.at(r, c)) << "(" << r << ", " << c << ")";
}

TEST(OpsWeight, WeightOfReadsTheTensorDtypeAndShape) {
  std::vector<uint8_t> bytes(64 * 64), scales(4);
  TensorView t;
  t.name = "w";
  t.dtype = DType::F8_E4M3;
  t.shape = {64, 64};
  t.data = bytes.data();
  TensorView s;
  s.name = "w.scale";
  s.dtype = DType::F8_E8M0;
  s.shape = {2, 2};
  s.data = scales.data();
  Weight w = weight_of(t, &s);
  EXPECT_EQ(w.format, WeightFormat::FP8);
  EXPECT_EQ(w.rows, 64);
  EXPECT_EQ(w.cols, 64);
  EXPECT_EQ(w.data, bytes.data());
  EXPECT_EQ(w.scale, scales.data());
  EXPECT_THROW(weight_of(t), Error);  // a quantized weight needs its .scale

  t.dtype = DType::I8;  // fp4: two e2m1 per byte, so the logical width doubles
  t.shape = {64, 32};
  w = weight_of(t, &s);
  EXPECT_EQ(w.format, WeightFormat::FP4);
  EXPECT_EQ(w.rows, 64);
  EXPECT_EQ(w.cols, 64);

  t.dtype = DType::F32;  // a vector is one row
  t.shape = {7};
  w = weight_of(t);
  EXPECT_EQ(w.format, WeightFormat::F32);
  EXPECT_EQ(w.rows, 1);
  EXPECT_EQ(w.cols, 7);
  EXPECT_EQ(w.scale, nullptr);

  t.dtype = DType::BF16;
  t.shape = {3, 5};
  w = weight_of(t);
  EXPECT_EQ(w.format, WeightFormat::BF16);
  EXPECT_EQ(w.rows, 3);
  EXPECT_EQ(w.cols, 5);

  t.dtype = DType::I32;
  EXPECT_THROW(weight_of(t), Error);
}

// ---- linear: quantized weights ----

// fp8 weights, 45 rows (the second 32-row block is partial and has its own scale), K = 160 (five
// K blocks with different scales), activations whose blocks differ in magnitude.
TEST(OpsLinear, Fp8WeightMatchesActQuantThenDoubleProduct) {
  const int M = 3, N = 45, K = 160;
  const OwnedWeight w = make_weight(WeightFormat::FP8, blocky_matrix(N, K, 0.05, 3), N, K);
  const std::vector<float> x = blocky_activations(M, K, 4);
  std::vector<float> y(M * N);
  linear(x.data(), M, w.view(), y.data());
  expect_bf16_of(y, naive_product(act_quant_rows(x, M, K), M, w), "fp8 45x160");
}

// Row counts that are not a multiple of 32, one row, and exactly one block.
TEST(OpsLinear, Fp8EdgeRowBlocks) {
  for (int N : {1, 31, 32, 33, 63, 65}) {
    const int M = 2, K = 64;
    const OwnedWeight w = make_weight(WeightFormat::FP8, blocky_matrix(N, K, 0.1, 10 + N), N, K);
    const std::vector<float> x = blocky_activations(M, K, 20 + N);
    std::vector<float> y(M * N);
    linear(x.data(), M, w.view(), y.data());
    expect_bf16_of(y, naive_product(act_quant_rows(x, M, K), M, w), "fp8 N=" + std::to_string(N));
  }
}

TEST(OpsLinear, Fp4WeightMatchesActQuantThenDoubleProduct) {
  for (int N : {1, 45, 64}) {
    const int M = 4, K = 128;
    const OwnedWeight w = make_weight(WeightFormat::FP4, blocky_matrix(N, K, 0.05, 30 + N), N, K);
    const std::vector<float> x = blocky_activations(M, K, 40 + N);
    std::vector<float> y(M * N);
    linear(x.data(), M, w.view(), y.data());
    expect_bf16_of(y, naive_product(act_quant_rows(x, M, K), M, w), "fp4 N=" + std::to_string(N));
  }
}

// The activation itself goes through e4m3 in front of a quantized GEMM: 1 + 2^-7 (a bf16 value)
// over the block scale 2^-8 is 258, which e4m3 (spacing 32 in [256, 448)) rounds to 256, so the
// fp8 product reads 1. A bf16 weight sees the activation as it is.
TEST(OpsLinear, QuantizedWeightsSeeTheActivationInE4m3) {
  const int K = 64;
  std::vector<float> x(K, 0.0f), wrow(K, 0.0f);
  x[0] = 1.0078125f;  // 1 + 2^-7
  x[40] = 0.25f;      // a second block with its own scale; w is 0 there
  wrow[0] = 1.0f;
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4, WeightFormat::BF16, WeightFormat::F32}) {
    const OwnedWeight w = make_weight(f, wrow, 1, K);
    float y = -1;
    linear(x.data(), 1, w.view(), &y);
    EXPECT_EQ(y, w.view().quantized() ? 1.0f : 1.0078125f) << test::format_name(f);
  }
}

// The block partials are added in K order into one fp32 accumulator: with partials 2^24, 1, -2^24
// (one nonzero product per 32-block), fp32 gives (2^24 + 1) - 2^24 = 0, since 2^24 + 1 is a tie
// that rounds to the even 2^24; in the order 2^24, -2^24, 1 it gives 1. Exactly representable in
// both formats: 2^24 = 256 · 2^16 (fp8, block scale 2^16) = 4 · 2^22 (fp4, block scale 2^22).
TEST(OpsLinear, BlockPartialsAccumulateInKOrderInFp32) {
  const int K = 96;
  std::vector<float> x(K, 0.0f);
  x[0] = x[32] = x[64] = 1.0f;  // act_quant keeps 1 exact (256 · 2^-8)
  const float big = 0x1p24f;
  struct Case {
    float b0, b1, b2, expected;
  };
  for (const Case& c : {Case{big, 1, -big, 0}, Case{big, -big, 1, 1}, Case{1, big, -big, 0}}) {
    std::vector<float> wrow(K, 0.0f);
    wrow[0] = c.b0;
    wrow[32] = c.b1;
    wrow[64] = c.b2;
    for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4}) {
      const OwnedWeight w = make_weight(f, wrow, 1, K);
      ASSERT_EQ(w.at(0, 0), c.b0);  // the weight holds the values exactly
      ASSERT_EQ(w.at(0, 32), c.b1);
      ASSERT_EQ(w.at(0, 64), c.b2);
      float y = -1;
      linear(x.data(), 1, w.view(), &y);
      EXPECT_EQ(y, c.expected) << test::format_name(f) << " partials " << c.b0 << ", " << c.b1 << ", " << c.b2;
    }
  }
}

// The reference asserts K % 32 == 0 for an fp8 / fp4 GEMM; so does linear.
TEST(OpsLinear, QuantizedWeightNeedsKAMultipleOf32) {
  const int N = 4, K = 40;
  const OwnedWeight w = make_weight(WeightFormat::FP8, bf16_normal(N * K, 0.1, 50), N, K);
  const std::vector<float> x = bf16_normal(K, 1.0, 51);
  std::vector<float> y(N);
  EXPECT_THROW(linear(x.data(), 1, w.view(), y.data()), Error);
}

// ---- linear: bf16 / fp32 weights ----

// bf16 weights: an fp32 product of the activation as it is, rounded to bf16. Shapes not multiples
// of anything.
TEST(OpsLinear, Bf16WeightMatchesDoubleProduct) {
  const int M = 5, N = 37, K = 70;
  const OwnedWeight w = make_weight(WeightFormat::BF16, bf16_normal(N * K, 0.2, 60), N, K);
  const std::vector<float> x = bf16_normal(M * K, 1.0, 61);
  std::vector<float> y(M * N);
  linear(x.data(), M, w.view(), y.data());
  expect_bf16_of(y, naive_product(x, M, w), "bf16 37x70");
}

// fp32 weights through linear: rounded to bf16 too.
TEST(OpsLinear, F32WeightThroughLinearIsRoundedToBf16) {
  const int M = 3, N = 29, K = 50;
  std::vector<float> wf(N * K);
  std::mt19937 rng(70);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (float& v : wf) v = normal(rng);  // full fp32 mantissas
  const OwnedWeight w = make_weight(WeightFormat::F32, wf, N, K);
  const std::vector<float> x = bf16_normal(M * K, 1.0, 71);
  std::vector<float> y(M * N);
  linear(x.data(), M, w.view(), y.data());
  expect_bf16_of(y, naive_product(x, M, w), "f32 via linear");
}

// linear_f32 (F.linear on fp32 tensors) is not rounded: within the fp32 summation bound of the
// double product (γ_K · Σ|a w|, a few 1e-6 relative here, far below bf16's 2^-9), and most outputs
// are not bf16 values at all. Checked for fp32 and bf16 weights (the MoE gate, mHC's fn).
TEST(OpsLinear, LinearF32DoesNotRound) {
  const int M = 3, N = 29, K = 50;
  std::vector<float> wf(N * K), x(M * K);
  std::mt19937 rng(80);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  for (float& v : wf) v = normal(rng);
  for (float& v : x) v = normal(rng) * 5.0f;  // fp32 inputs too (the compressor at ratio > 1)
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16}) {
    const OwnedWeight w = make_weight(f, wf, N, K);
    std::vector<float> y(M * N);
    linear_f32(x.data(), M, w.view(), y.data());
    const Naive ref = naive_product(x, M, w);
    int not_bf16 = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      EXPECT_NEAR(y[i], ref.y[i], ref.slack[i] + 1e-30) << test::format_name(f) << " output " << i;
      not_bf16 += y[i] != round_bf16(y[i]);
    }
    EXPECT_GT(not_bf16, int(y.size()) * 9 / 10) << test::format_name(f);
  }
}

// A weight too large to dequantize at once is multiplied a slab of rows at a time (2^24 / K rows:
// 1024 for K = 16384); 1061 rows is a full slab and a partial one. Every output lands in its
// place and matches the double product.
TEST(OpsLinear, LargeBf16WeightAcrossSlabs) {
  const int M = 2, N = 1061, K = 16384;
  std::vector<float> wf(size_t(N) * K);  // 17M values: a multiplicative hash, cheaper than <random>
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = float(int((uint32_t(i) * 2654435761u) >> 16) - 32768) * 0x1p-20f;
  const OwnedWeight w = make_weight(WeightFormat::BF16, wf, N, K);
  const std::vector<float> x = bf16_normal(size_t(M) * K, 1.0, 91);
  std::vector<float> y(size_t(M) * N);
  linear(x.data(), M, w.view(), y.data());
  const Naive ref = naive_product(x, M, w);
  expect_bf16_of(y, ref, "bf16 1061x16384");
  std::vector<float> yf(size_t(M) * N);
  linear_f32(x.data(), M, w.view(), yf.data());
  for (size_t i = 0; i < yf.size(); ++i) ASSERT_NEAR(yf[i], ref.y[i], ref.slack[i]) << "linear_f32 output " << i;
}

}  // namespace
}  // namespace dsv41
