// Unit tests of src/backend/cpu/norm.h (RMSNorm) and rope.h (RoPE with YaRN) against formulas in
// double and hand-computed cases. Reference: model.py RMSNorm (fp32 statistic, bf16 output),
// precompute_freqs_cis (fp32 frequencies, YaRN ramp) and apply_rotary_emb (fp32 complex product of
// interleaved pairs, copied back into a bf16 tensor).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/norm.h"
#include "backend/cpu/rope.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::kF32Unit;
using test::make_weight;
using test::OwnedWeight;

constexpr float kNormEps = 1e-20f;  // V4.1's norm_eps

// ---- RMSNorm ----

// y = w · x / sqrt(mean(x²) + eps), in double.
std::vector<double> naive_rms_norm(const std::vector<float>& x, int64_t rows, int64_t dim, const OwnedWeight* w,
                                   double eps) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = (w ? w->at(0, i) : 1.0) * x[r * dim + i] * inv;
  }
  return y;
}

// Tolerance: one bf16 ulp of the exact value. The fp32 statistic errs by at most about
// (dim + 4) · 2^-24 relative (the sum of dim squares, the mean, sqrt, the division, two products):
// ~6e-6 for dim 96, far below bf16's half ulp (>= 2^-9 relative), so the op returns bf16(exact) or, when the
// exact value sits within that error of a rounding midpoint, its neighbour one ulp away. The
// neighbour is rare: at least 99% of the outputs must be bf16(exact).
void expect_norm(const std::vector<float>& y, const std::vector<double>& ref, const char* what) {
  size_t exact = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    ASSERT_NEAR(y[i], ref[i], bf16_ulp(ref[i])) << what << " element " << i;
    ASSERT_EQ(y[i], round_bf16(y[i])) << what << " element " << i << " is not a bf16 value";
    exact += y[i] == round_bf16(float(ref[i]));
  }
  EXPECT_GE(double(exact), 0.99 * double(y.size())) << what;
}

TEST(OpsRmsNorm, MatchesDoubleWithinOneBf16Ulp) {
  const int rows = 5, dim = 96;  // several rows: the parallel path; dim not a power of two
  std::vector<float> x = bf16_normal(rows * dim, 1.0, 1);
  for (int i = 0; i < dim; ++i) x[2 * dim + i] *= 1024.0f;  // rows of very different scale
  for (int i = 0; i < dim; ++i) x[3 * dim + i] = round_bf16(x[3 * dim + i] * 1e-6f);
  std::vector<float> y(x.size());

  rms_norm(x.data(), rows, dim, nullptr, kNormEps, y.data());
  expect_norm(y, naive_rms_norm(x, rows, dim, nullptr, kNormEps), "unweighted");

  // the checkpoint's norm weights are bf16; an fp32 one is read the same way
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F32}) {
    const OwnedWeight w = make_weight(f, bf16_normal(dim, 0.5, 2), 1, dim);
    const Weight view = w.view();
    rms_norm(x.data(), rows, dim, &view, kNormEps, y.data());
    expect_norm(y, naive_rms_norm(x, rows, dim, &w, kNormEps), test::format_name(f));
  }
}

// Hand case: a row of 2s has mean square 4, rsqrt 1/2, so the normalized row is exactly 1 and the
// weighted output is exactly the weight. Also a larger eps that shows in the result: x = (3, 4),
// mean square 12.5, eps 3.5 gives rsqrt(16) = 1/4: (0.75, 1).
TEST(OpsRmsNorm, HandComputedRows) {
  const std::vector<float> x = {2, 2, 2, 2};
  const std::vector<float> wv = {0.5f, -3.0f, 1.25f, 7.0f};
  const Weight w = test::f32_view(wv, 1, 4);
  std::vector<float> y(4);
  rms_norm(x.data(), 1, 4, nullptr, kNormEps, y.data());
  EXPECT_EQ(y, std::vector<float>({1, 1, 1, 1}));
  rms_norm(x.data(), 1, 4, &w, kNormEps, y.data());
  EXPECT_EQ(y, wv);

  const std::vector<float> x2 = {3, 4};
  std::vector<float> y2(2);
  rms_norm(x2.data(), 1, 2, nullptr, 3.5f, y2.data());
  EXPECT_EQ(y2, std::vector<float>({0.75f, 1.0f}));
  EXPECT_EQ(rms_inverse(x2.data(), 2, 3.5f), 0.25f);
}

// An all-zero row: mean 0, rsqrt(0 + 1e-20) = 1e10 (finite in fp32), 0 · 1e10 = 0. The reference
// computes the same, so zeros, not NaN; the rows around it are unaffected.
TEST(OpsRmsNorm, ZeroRowGivesZerosNotNaN) {
  const int dim = 64;
  std::vector<float> x = bf16_normal(3 * dim, 1.0, 3);
  std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.0f);
  const OwnedWeight w = make_weight(WeightFormat::BF16, bf16_normal(dim, 1.0, 4), 1, dim);
  const Weight view = w.view();
  std::vector<float> y(x.size(), -1.0f);
  rms_norm(x.data(), 3, dim, &view, kNormEps, y.data());
  for (int i = 0; i < dim; ++i) EXPECT_EQ(y[dim + i], 0.0f) << i;
  const std::vector<double> ref = naive_rms_norm(x, 3, dim, &w, kNormEps);
  for (int i : {0, 2 * dim}) EXPECT_NEAR(y[i], ref[i], bf16_ulp(ref[i]));
  EXPECT_FLOAT_EQ(rms_inverse(x.data() + dim, dim, kNormEps), 1e10f);
}

// Scaling a row by a power of two scales its fp32 mean square by an exact power of four (eps is far
// below its ulp here), so the normalized output is bit-for-bit the same.
TEST(OpsRmsNorm, PowerOfTwoScaleInvariance) {
  const int dim = 128;
  const std::vector<float> x = bf16_normal(dim, 1.0, 5);
  std::vector<float> y(dim), ys(dim), xs(dim);
  rms_norm(x.data(), 1, dim, nullptr, kNormEps, y.data());
  for (int e : {-10, -3, 5, 10}) {
    for (int i = 0; i < dim; ++i) xs[i] = std::ldexp(x[i], e);
    rms_norm(xs.data(), 1, dim, nullptr, kNormEps, ys.data());
    EXPECT_EQ(ys, y) << "scale 2^" << e;
  }
}

// rms_inverse against double: relative error at most (n + 4) · 2^-24 (see expect_norm).
TEST(OpsRmsNorm, RmsInverseMatchesDouble) {
  for (int n : {1, 7, 96, 4096}) {
    const std::vector<float> x = bf16_normal(n, 3.0, 10 + n);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double expected = 1.0 / std::sqrt(ss / n + double(kNormEps));
    EXPECT_NEAR(rms_inverse(x.data(), n, kNormEps), expected, expected * (n + 4) * kF32Unit) << "n = " << n;
  }
}

// ---- RoPE ----

// Frequency i without YaRN: base^(-2i / dim), in double. The op follows torch's fp32 evaluation
// 1 / (base ** (2i / dim)): the exponent rounded to fp32 (error 2^-24 relative, which pow turns into
// ln(base) · (2i/dim) · 2^-24 <= 12 · 2^-24 relative for base 160000), pow within an ulp, and the
// reciprocal; 2^-19 relative (32 · 2^-24) covers that.
double plain_frequency(int i, int dim, double base) { return std::pow(base, -2.0 * i / dim); }
constexpr double kFreqRelTol = 0x1p-19;

TEST(OpsRope, FrequenciesWithoutYarnMatchThePowerLaw) {
  for (double base : {10000.0, 40000.0, 160000.0})
    for (int dim : {16, 64, 96}) {
      const RopeTable t(dim, base, 0, 16, 32, 1);
      ASSERT_EQ(t.dim(), dim);
      ASSERT_EQ(t.frequencies().size(), size_t(dim / 2));
      EXPECT_EQ(t.frequencies()[0], 1.0f);
      for (int i = 0; i < dim / 2; ++i) {
        const double f = plain_frequency(i, dim, base);
        EXPECT_NEAR(t.frequencies()[i], f, f * kFreqRelTol) << "base " << base << " dim " << dim << " i " << i;
      }
      // original_seq_len = 0 turns YaRN off: factor and betas are not read
      EXPECT_EQ(RopeTable(dim, base, 0, 40, 8, 2).frequencies(), t.frequencies());
    }
}

// YaRN at V4.1's values on the compressed layers: rope dim 64, theta 160000, original context
// 65536, factor 16, beta_fast 32, beta_slow 1. corrected_dim(r) = d · ln(L / (2π r)) / (2 ln θ):
// 15.45 for r = 32 (low = floor = 15) and 24.71 for r = 1 (high = ceil = 25). Frequencies up to
// index 15 are untouched (the ramp is 0: bit-for-bit the plain table), from 25 on divided by 16
// (ramp 1: exactly the plain value / 16), and in between f · ((1 - r) + r / 16), r = (i - 15) / 10.
TEST(OpsRope, YarnAtV41Values) {
  const int dim = 64;
  const double theta = 160000, factor = 16;
  const int64_t original = 65536;
  auto corrected_dim = [&](double rotations) {
    return dim * std::log(double(original) / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  const int low = int(std::floor(corrected_dim(32))), high = int(std::ceil(corrected_dim(1)));
  ASSERT_EQ(low, 15);
  ASSERT_EQ(high, 25);

  const RopeTable yarn(dim, theta, original, factor, 32, 1);
  const RopeTable plain(dim, theta, 0, factor, 32, 1);
  const std::vector<float>& f = yarn.frequencies();
  for (int i = 0; i < dim / 2; ++i) {
    const double p = plain_frequency(i, dim, theta);
    if (i <= low) {
      EXPECT_EQ(f[i], plain.frequencies()[i]) << "i " << i << " must be unchanged";
    } else if (i >= high) {
      EXPECT_EQ(f[i], plain.frequencies()[i] / 16.0f) << "i " << i << " must be divided by 16";
    } else {
      const double r = (i - low) / double(high - low);
      const double expected = p * ((1 - r) + r / factor);
      // the blend adds a few fp32 roundings (ramp, two products, a sum) to the power law's error
      EXPECT_NEAR(f[i], expected, expected * 2 * kFreqRelTol) << "i " << i;
      EXPECT_LT(f[i], plain.frequencies()[i]) << "i " << i;
      EXPECT_GT(f[i], plain.frequencies()[i] / 16.0f) << "i " << i;
    }
    if (i > 0) {
      EXPECT_LT(f[i], f[i - 1]) << "frequencies decrease, i " << i;
    }
  }
}

// x rotated by pos in double: pair (a, b) turns by the angle pos · f_i, where the angle is the fp32
// product (torch.outer of the positions and the fp32 frequencies, as the op computes it; at pos 1e6
// the rounding of that product alone moves the angle by up to 0.03 rad, so it is part of the
// definition, not an error).
std::vector<double> naive_rotate(const std::vector<float>& x, const RopeTable& t, int64_t pos, bool inverse) {
  std::vector<double> y(x.size());
  for (int i = 0; i < t.dim() / 2; ++i) {
    const double angle = double(float(pos) * t.frequencies()[i]) * (inverse ? -1 : 1);
    const double c = std::cos(angle), s = std::sin(angle), a = x[2 * i], b = x[2 * i + 1];
    y[2 * i] = a * c - b * s;
    y[2 * i + 1] = a * s + b * c;
  }
  return y;
}

// Against the double rotation, each output within one bf16 ulp of the exact value (the bf16 copy)
// plus 4 · 2^-24 · (|a| + |b|) for fp32 cos / sin (an ulp each), the products and the sum, which
// matters only when a component cancels to near zero.
TEST(OpsRope, ApplyMatchesDoubleRotation) {
  const RopeTable tables[] = {RopeTable(64, 10000, 0, 16, 32, 1), RopeTable(64, 160000, 65536, 16, 32, 1)};
  for (const RopeTable& t : tables)
    for (int64_t pos : {1, 2, 7, 100, 1000, 4095, 65535, 1000000})
      for (bool inverse : {false, true}) {
        const std::vector<float> x = bf16_normal(64, 1.0, uint32_t(pos));
        std::vector<float> y = x;
        t.apply(y.data(), pos, inverse);
        const std::vector<double> ref = naive_rotate(x, t, pos, inverse);
        for (int i = 0; i < 64; ++i) {
          const double pair = std::fabs(x[i & ~1]) + std::fabs(x[i | 1]);
          ASSERT_NEAR(y[i], ref[i], bf16_ulp(ref[i]) + 4 * kF32Unit * pair)
              << "pos " << pos << " inverse " << inverse << " element " << i;
          ASSERT_EQ(y[i], round_bf16(y[i])) << "bf16 output";
        }
      }
}

// Position 0 turns by angle 0: cos 1, sin 0, so a · 1 - b · 0 = a exactly, forward and inverse.
TEST(OpsRope, PositionZeroIsTheIdentity) {
  const RopeTable t(64, 160000, 65536, 16, 32, 1);
  const std::vector<float> x = bf16_normal(64, 2.0, 40);
  for (bool inverse : {false, true}) {
    std::vector<float> y = x;
    t.apply(y.data(), 0, inverse);
    EXPECT_EQ(y, x) << "inverse " << inverse;
  }
}

// Pair (2i, 2i+1) is frequency i: with only pair i nonzero, the output is (cos θ, sin θ) of the
// angle pos · f_i, and every other pair stays zero. Pairs are interleaved, not split halves.
TEST(OpsRope, PairsAreInterleaved) {
  const RopeTable t(16, 10000, 0, 16, 32, 1);
  for (int i = 0; i < 8; ++i) {
    std::vector<float> x(16, 0.0f);
    x[2 * i] = 1.0f;
    t.apply(x.data(), 3, false);
    const double angle = double(3.0f * t.frequencies()[i]);
    for (int j = 0; j < 16; ++j) {
      const double expected = j == 2 * i ? std::cos(angle) : j == 2 * i + 1 ? std::sin(angle) : 0.0;
      EXPECT_NEAR(x[j], expected, bf16_ulp(expected) + 2 * kF32Unit) << "pair " << i << " element " << j;
    }
  }
}

// Rotating back undoes the rotation up to the two bf16 roundings. A rounding to bf16 errs by at
// most 2^-8 relative (half an ulp; bf16 keeps 8 significant bits), so the first leaves an error
// vector of norm <= 2^-8 · r per pair (r the pair's norm), the inverse rotation keeps that norm, and
// the second rounding adds <= 2^-8 · r (1 + 2^-8) more: 2^-7 · r (plus fp32 noise far below it)
// bounds each component. Inverse by pos is also bit-for-bit a rotation by -pos (cos even, sin odd).
TEST(OpsRope, InverseUndoesTheRotation) {
  const RopeTable t(64, 160000, 65536, 16, 32, 1);
  for (int64_t pos : {1, 5, 333, 65536, 262143}) {
    const std::vector<float> x = bf16_normal(64, 1.0, uint32_t(100 + pos));
    std::vector<float> y = x;
    t.apply(y.data(), pos, false);
    std::vector<float> back = y;
    t.apply(back.data(), pos, true);
    for (int i = 0; i < 32; ++i) {
      const double r = std::hypot(double(x[2 * i]), double(x[2 * i + 1]));
      EXPECT_NEAR(back[2 * i], x[2 * i], 0x1p-7 * r) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(back[2 * i + 1], x[2 * i + 1], 0x1p-7 * r) << "pos " << pos << " pair " << i;
      // the rotation keeps each pair's norm, up to the bf16 rounding of the two components
      // (error vector <= 2^-8 · r) and fp32 (2^-20 · r)
      const double ry = std::hypot(double(y[2 * i]), double(y[2 * i + 1]));
      EXPECT_NEAR(ry, r, (0x1p-8 + 0x1p-20) * r) << "pos " << pos << " pair " << i;
    }
    std::vector<float> neg = x, inv = x;
    t.apply(neg.data(), -pos, false);
    t.apply(inv.data(), pos, true);
    EXPECT_EQ(neg, inv) << "pos " << pos;
  }
}

// Angles add: rotating by p1 then p2 equals rotating by p1 + p2, up to one extra bf16 rounding and
// the fp32 rounding of each angle product (<= pos · f · 2^-24 rad, under 1e-4 here): 2^-7 · r again.
TEST(OpsRope, RotationsCompose) {
  const RopeTable t(64, 10000, 0, 16, 32, 1);
  const std::vector<float> x = bf16_normal(64, 1.0, 77);
  std::vector<float> two = x, one = x;
  t.apply(two.data(), 300, false);
  t.apply(two.data(), 45, false);
  t.apply(one.data(), 345, false);
  for (int i = 0; i < 32; ++i) {
    const double r = std::hypot(double(x[2 * i]), double(x[2 * i + 1]));
    EXPECT_NEAR(two[2 * i], one[2 * i], 0x1p-7 * r) << "pair " << i;
    EXPECT_NEAR(two[2 * i + 1], one[2 * i + 1], 0x1p-7 * r) << "pair " << i;
  }
}

}  // namespace
}  // namespace dsv41
