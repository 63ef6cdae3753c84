// Unit tests of src/backend/cpu/mhc.h (manifold-constrained hyper-connections) against a naive
// version in double and hand-set weights.
//
// Reference: model.py Block.hc_mixes (one fp32 projection of the flattened hc·d stream times the
// stream's rsqrt(mean(x²) + norm_eps)), kernel hc_split_sinkhorn (pre = σ(m·s0 + b) + eps,
// post = 2σ(m·s1 + b), comb = row softmax + eps, a column normalization, then (iters - 1) times
// rows then columns, each dividing by (sum + eps)), Block.hc_pre (Σ_i pre_i X_i, to bf16) and
// Block.hc_post (post_j f + Σ_i comb[i][j] X_i, to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/mhc.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::f32_view;
using test::kF32Unit;

constexpr float kNormEps = 1e-20f;  // V4.1 norm_eps
constexpr float kHcEps = 1e-6f;     // V4.1 hc_eps
constexpr int kIters = 20;          // V4.1 hc_sinkhorn_iters

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

struct Mixes {
  std::vector<double> pre, post, comb;
  double mix_error = 0;  // bound on the fp32 error of the scaled mixes (m · scale), see below
};

// hc_mixes for one token in double. mix_error bounds the fp32 error of the logits m · scale fed to
// σ and to the softmax. The data of these tests is dyadic (stream values multiples of 2^-3 up to
// 2^6, fn multiples of 2^-8 up to 1/4), so the projection and the sum of squares are exact in fp32
// in any order (the products are multiples of 2^-11 and every partial sum stays below 2^13, 24
// bits), and K = hc·d is a power of two: only rsqrt (sqrt and a division), the product by it and
// the product by the scale round, 4 fp32 units of the logit at most.
Mixes naive_mixes(const float* x, int hc, int d, const std::vector<float>& fn, const std::vector<float>& base,
                  const std::vector<float>& scale, double norm_eps, int iters, double eps) {
  const int K = hc * d, n_mix = (2 + hc) * hc;
  double ss = 0;
  for (int k = 0; k < K; ++k) ss += double(x[k]) * x[k];
  const double inv = 1 / std::sqrt(ss / K + norm_eps);
  std::vector<double> m(static_cast<size_t>(n_mix));
  Mixes r;
  const double max_scale = std::max({std::fabs(scale[0]), std::fabs(scale[1]), std::fabs(scale[2])});
  for (int j = 0; j < n_mix; ++j) {
    double sum = 0, abs_sum = 0;
    for (int k = 0; k < K; ++k) {
      sum += double(x[k]) * fn[size_t(j) * K + k];
      abs_sum += std::fabs(double(x[k]) * fn[size_t(j) * K + k]);
    }
    m[size_t(j)] = sum * inv;
    EXPECT_EQ(double(float(sum)), sum) << "the data must keep the projection exact";
    EXPECT_LT(abs_sum, 0x1p13);
    r.mix_error = std::max(r.mix_error, 4 * kF32Unit * std::fabs(sum * inv) * max_scale);
  }
  r.pre.resize(size_t(hc));
  r.post.resize(size_t(hc));
  for (int j = 0; j < hc; ++j) {
    r.pre[size_t(j)] = sigmoid(m[size_t(j)] * scale[0] + base[size_t(j)]) + eps;
    r.post[size_t(j)] = 2 * sigmoid(m[size_t(hc + j)] * scale[1] + base[size_t(hc + j)]);
  }
  std::vector<double>& c = r.comb;
  c.resize(size_t(hc * hc));
  for (int i = 0; i < hc; ++i) {
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < hc; ++j) {
      c[size_t(i * hc + j)] = m[size_t(2 * hc + i * hc + j)] * scale[2] + base[size_t(2 * hc + i * hc + j)];
      mx = std::max(mx, c[size_t(i * hc + j)]);
    }
    for (int j = 0; j < hc; ++j) sum += c[size_t(i * hc + j)] = std::exp(c[size_t(i * hc + j)] - mx);
    for (int j = 0; j < hc; ++j) c[size_t(i * hc + j)] = c[size_t(i * hc + j)] / sum + eps;
  }
  auto columns = [&] {
    for (int j = 0; j < hc; ++j) {
      double s = 0;
      for (int i = 0; i < hc; ++i) s += c[size_t(i * hc + j)];
      for (int i = 0; i < hc; ++i) c[size_t(i * hc + j)] /= s + eps;
    }
  };
  auto rows = [&] {
    for (int i = 0; i < hc; ++i) {
      double s = 0;
      for (int j = 0; j < hc; ++j) s += c[size_t(i * hc + j)];
      for (int j = 0; j < hc; ++j) c[size_t(i * hc + j)] /= s + eps;
    }
  };
  columns();
  for (int t = 0; t < iters - 1; ++t) {
    rows();
    columns();
  }
  return r;
}

struct HcCase {
  int hc, d;
  std::vector<float> fn, base, scale;
};

// fn: multiples of 2^-8 in [-1/4, 1/4]; base N(0, 0.5); scale (0.5, 0.7, 1): logits of a few units.
HcCase random_case(int hc, int d, uint32_t seed) {
  HcCase c{hc, d, {}, {}, {}};
  const int n_mix = (2 + hc) * hc;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  c.fn.resize(size_t(n_mix) * hc * d);
  for (float& v : c.fn) v = float(int(rng() % 129) - 64) * 0x1p-8f;
  c.base.resize(size_t(n_mix));
  for (float& v : c.base) v = 0.5f * normal(rng);
  c.scale = {0.5f, 0.7f, 1.0f};
  return c;
}

// Streams: multiples of 2^-3 in [-2, 2] (bf16 values).
std::vector<float> dyadic_streams(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) v = float(int(rng() % 33) - 16) * 0.125f;
  return x;
}

HcWeights weights_of(const HcCase& c) {
  const int n_mix = (2 + c.hc) * c.hc;
  return HcWeights{f32_view(c.fn, n_mix, int64_t(c.hc) * c.d), f32_view(c.base, 1, n_mix), f32_view(c.scale, 1, 3)};
}

// Against the double version, three tokens of 4 streams of 64 (the rows are independent).
// Tolerances: pre and post move by at most σ' <= 1/4 (times 2 for post) of the logit error
// (mix_error) plus 8 fp32 units of their value (σ's exp, sum, division, + eps); comb entries by at
// most 4 · mix_error (the softmax moves each entry by <= 2Δ relative; Sinkhorn, a contraction for
// positive matrices, does not amplify it) plus 40 normalizations × (hc + 2) units, each sum of hc
// terms and division rounding by at most (hc + 2) · 2^-24.
TEST(OpsHcMixes, MatchesDoubleSinkhorn) {
  const int hc = 4, d = 64, rows = 3;
  const HcCase c = random_case(hc, d, 1);
  std::vector<float> X = dyadic_streams(size_t(rows) * hc * d, 2);
  for (int k = 0; k < hc * d; ++k) X[size_t(2 * hc * d + k)] *= 32.0f;  // a token of larger scale
  std::vector<float> pre(size_t(rows) * hc), post(size_t(rows) * hc), comb(size_t(rows) * hc * hc);
  hc_mixes(X.data(), rows, hc, d, weights_of(c), kNormEps, kIters, kHcEps, pre.data(), post.data(), comb.data());
  for (int r = 0; r < rows; ++r) {
    const Mixes ref = naive_mixes(X.data() + size_t(r) * hc * d, hc, d, c.fn, c.base, c.scale, kNormEps, kIters, kHcEps);
    ASSERT_LT(ref.mix_error, 1e-4);  // the bound is meaningful for this data
    for (int j = 0; j < hc; ++j) {
      EXPECT_NEAR(pre[size_t(r * hc + j)], ref.pre[size_t(j)], ref.mix_error / 4 + 8 * kF32Unit) << "row " << r;
      EXPECT_NEAR(post[size_t(r * hc + j)], ref.post[size_t(j)], ref.mix_error / 2 + 16 * kF32Unit) << "row " << r;
    }
    const double comb_tol = 4 * ref.mix_error + 40 * (hc + 2) * kF32Unit;
    for (int k = 0; k < hc * hc; ++k)
      EXPECT_NEAR(comb[size_t(r * hc * hc + k)], ref.comb[size_t(k)], comb_tol) << "row " << r << " entry " << k;
  }
}

// comb is doubly stochastic: the last step is a column normalization, so each column sums to
// S / (S + eps) = 1 - ~1e-6, plus the fp32 rounding of hc divisions and the sum (~6 · 2^-24):
// within 1e-5. Rows are only approximately 1 after 20 sweeps: they must sum to what the double
// Sinkhorn's rows sum to (the convergence of the algorithm, not an error of the op), within the
// comb tolerance times hc. For this data (logits spread over a few units) 20 sweeps bring them
// within ~1e-4 of 1; 1e-3 is asserted. (Sharper logits converge more slowly: with the comb scale at
// 2, rows still miss 1 by ~1e-2 after 20 sweeps, in the double version as well.)
TEST(OpsHcMixes, CombIsDoublyStochastic) {
  const int hc = 4, d = 32, rows = 8;
  const HcCase c = random_case(hc, d, 3);
  const std::vector<float> X = dyadic_streams(size_t(rows) * hc * d, 4);
  std::vector<float> pre(size_t(rows) * hc), post(size_t(rows) * hc), comb(size_t(rows) * hc * hc);
  hc_mixes(X.data(), rows, hc, d, weights_of(c), kNormEps, kIters, kHcEps, pre.data(), post.data(), comb.data());
  for (int r = 0; r < rows; ++r) {
    const float* cm = comb.data() + size_t(r) * hc * hc;
    const Mixes ref = naive_mixes(X.data() + size_t(r) * hc * d, hc, d, c.fn, c.base, c.scale, kNormEps, kIters, kHcEps);
    for (int j = 0; j < hc; ++j) {
      double col = 0, row = 0, ref_row = 0;
      for (int i = 0; i < hc; ++i) {
        col += cm[i * hc + j];
        row += cm[j * hc + i];
        ref_row += ref.comb[size_t(j * hc + i)];
        EXPECT_GT(cm[i * hc + j], 0.0f);
      }
      EXPECT_NEAR(col, 1.0, 1e-5) << "token " << r << " column " << j;
      EXPECT_NEAR(row, ref_row, hc * (4 * ref.mix_error + 40 * (hc + 2) * kF32Unit)) << "token " << r << " row " << j;
      EXPECT_NEAR(row, 1.0, 1e-3) << "token " << r << " row " << j;
    }
    for (int j = 0; j < hc; ++j) {
      EXPECT_GT(pre[size_t(r * hc + j)], kHcEps);
      EXPECT_LT(pre[size_t(r * hc + j)], 1 + 2 * kHcEps);
      EXPECT_GT(post[size_t(r * hc + j)], 0.0f);
      EXPECT_LT(post[size_t(r * hc + j)], 2.0f);
    }
  }
}

// Hand-set weights, hc = 2, d = 2, every stream (1, 1): mean square 1, rsqrt(1 + 1e-20) = 1 in fp32,
// so the mixes are the rows of fn summed: pre0 = 1, pre1 = 0, post0 = 2, post1 = -4, comb 0.
// With scale (2, 0.5, 1) and base (-1, 0.25 | 0, 1 | 0 0 0 0):
//   pre0 = σ(2 · 1 - 1) + 1e-6 = σ(1) + 1e-6      pre1 = σ(0.25) + 1e-6
//   post0 = 2σ(0.5 · 2 + 0) = 2σ(1)                post1 = 2σ(0.5 · -4 + 1) = 2σ(-1)
//   comb: all logits 0, a uniform softmax, every entry 0.5 minus O(eps), all four equal.
// Tolerance 8 fp32 units of the value (exp, sum, division, products, + eps); the eps itself
// (1e-6, about 17 units at 0.73) must show.
TEST(OpsHcMixes, HandSetWeights) {
  const int hc = 2, d = 2;
  const std::vector<float> X = {1, 1, 1, 1};
  std::vector<float> fn = {
      1,    0,    0,  0,   // pre0
      0.5f, 0.5f, -1, 0,   // pre1
      0,    0,    0,  2,   // post0
      -1,   -1,   -1, -1,  // post1
  };
  fn.resize(8 * 4, 0.0f);  // comb rows: zero
  const std::vector<float> base = {-1, 0.25f, 0, 1, 0, 0, 0, 0};
  const std::vector<float> scale = {2, 0.5f, 1};
  const HcWeights w{f32_view(fn, 8, 4), f32_view(base, 1, 8), f32_view(scale, 1, 3)};
  std::vector<float> pre(2), post(2), comb(4);
  hc_mixes(X.data(), 1, hc, d, w, kNormEps, kIters, kHcEps, pre.data(), post.data(), comb.data());
  const double s1 = 0.7310585786300049, s025 = 0.5621765008857981;  // σ(1), σ(0.25)
  EXPECT_NEAR(pre[0], s1 + 1e-6, 8 * kF32Unit);
  EXPECT_NEAR(pre[1], s025 + 1e-6, 8 * kF32Unit);
  EXPECT_GT(std::fabs(pre[0] - s1), 0.9e-6);  // the + eps is there
  EXPECT_NEAR(post[0], 2 * s1, 16 * kF32Unit);
  EXPECT_NEAR(post[1], 2 * (1 - s1), 16 * kF32Unit);
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(comb[k], comb[0]);
    EXPECT_NEAR(comb[k], 0.5, 4e-6);
  }
}

// A strongly peaked comb logit pattern stays a near-permutation after Sinkhorn, and the
// orientation is comb[i][j] = entry (i, j) of the mixes' row-major hc×hc block: base 10 at
// (i, (i + 1) mod hc). fn = 0 makes every mix 0, so pre = σ(base) + eps and post = 2σ(base) exactly
// as hand-set.
TEST(OpsHcMixes, PeakedCombKeepsItsOrientation) {
  const int hc = 4, d = 8, n_mix = (2 + hc) * hc;
  const std::vector<float> X = bf16_normal(size_t(hc) * d, 1.0, 5);
  const std::vector<float> fn(size_t(n_mix) * hc * d, 0.0f);
  std::vector<float> base(size_t(n_mix), 0.0f);
  base[0] = 2;         // pre0 = σ(2) + eps
  base[hc + 1] = -3;   // post1 = 2σ(-3)
  for (int i = 0; i < hc; ++i) base[size_t(2 * hc + i * hc + (i + 1) % hc)] = 10;
  const std::vector<float> scale = {1, 1, 1};
  const HcWeights w{f32_view(fn, n_mix, hc * d), f32_view(base, 1, n_mix), f32_view(scale, 1, 3)};
  std::vector<float> pre(hc), post(hc), comb(hc * hc);
  hc_mixes(X.data(), 1, hc, d, w, kNormEps, kIters, kHcEps, pre.data(), post.data(), comb.data());
  EXPECT_NEAR(pre[0], sigmoid(2) + 1e-6, 8 * kF32Unit);
  EXPECT_NEAR(pre[1], 0.5 + 1e-6, 8 * kF32Unit);
  EXPECT_NEAR(post[1], 2 * sigmoid(-3), 16 * kF32Unit);
  EXPECT_EQ(post[0], 1.0f);
  for (int i = 0; i < hc; ++i)
    for (int j = 0; j < hc; ++j) {
      if (j == (i + 1) % hc) {
        EXPECT_GT(comb[i * hc + j], 0.999f) << i << "," << j;
      } else {
        EXPECT_LT(comb[i * hc + j], 1e-3f) << i << "," << j;
      }
    }
}

// ---- hc_pre / hc_post ----

// hc_pre against double: one bf16 ulp of the exact value (the output rounding, or its neighbour
// when the fp32 sum of hc terms, error <= hc · 2^-24 · Σ|pre X|, straddles a midpoint) plus that
// fp32 error, which matters only for sums that cancel to near zero.
TEST(OpsHcPre, MatchesDouble) {
  const int hc = 4, d = 256;
  const std::vector<float> X = bf16_normal(size_t(hc) * d, 1.0, 6);
  const std::vector<float> pre = {0.7310596f, 0.25f, 0.0625001f, 0.999f};
  std::vector<float> y(d);
  hc_pre(X.data(), pre.data(), hc, d, y.data());
  int exact = 0;
  for (int k = 0; k < d; ++k) {
    double sum = 0, abs_sum = 0;
    for (int i = 0; i < hc; ++i) {
      sum += double(pre[i]) * X[size_t(i) * d + k];
      abs_sum += std::fabs(double(pre[i]) * X[size_t(i) * d + k]);
    }
    EXPECT_NEAR(y[k], sum, bf16_ulp(sum) + hc * kF32Unit * abs_sum) << k;
    EXPECT_EQ(y[k], round_bf16(y[k]));
    exact += y[k] == round_bf16(float(sum));
  }
  EXPECT_GE(exact, d * 99 / 100);
}

// The first layer's one-hot pre mix (model.py make_identity_pre_mix) collapses to stream 0 exactly.
TEST(OpsHcPre, OneHotPicksAStream) {
  const int hc = 4, d = 16;
  const std::vector<float> X = bf16_normal(size_t(hc) * d, 1.0, 7);
  for (int s = 0; s < hc; ++s) {
    std::vector<float> pre(hc, 0.0f), y(d);
    pre[s] = 1.0f;
    hc_pre(X.data(), pre.data(), hc, d, y.data());
    EXPECT_EQ(y, std::vector<float>(X.begin() + s * d, X.begin() + (s + 1) * d)) << "stream " << s;
  }
}

// hc_post against double, same tolerance reasoning with hc + 1 terms.
TEST(OpsHcPost, MatchesDouble) {
  const int hc = 4, d = 128;
  const HcCase c = random_case(hc, d, 8);
  const std::vector<float> X = bf16_normal(size_t(hc) * d, 1.0, 9);
  const std::vector<float> f = bf16_normal(d, 2.0, 10);
  std::vector<float> pre(hc), post(hc), comb(hc * hc);
  hc_mixes(X.data(), 1, hc, d, weights_of(c), kNormEps, kIters, kHcEps, pre.data(), post.data(), comb.data());
  std::vector<float> out(size_t(hc) * d);
  hc_post(f.data(), X.data(), post.data(), comb.data(), hc, d, out.data());
  int exact = 0;
  for (int j = 0; j < hc; ++j)
    for (int k = 0; k < d; ++k) {
      double sum = double(post[j]) * f[k], abs_sum = std::fabs(sum);
      for (int i = 0; i < hc; ++i) {
        sum += double(comb[i * hc + j]) * X[size_t(i) * d + k];
        abs_sum += std::fabs(double(comb[i * hc + j]) * X[size_t(i) * d + k]);
      }
      const float got = out[size_t(j) * d + k];
      EXPECT_NEAR(got, sum, bf16_ulp(sum) + (hc + 2) * kF32Unit * abs_sum) << j << "," << k;
      EXPECT_EQ(got, round_bf16(got));
      exact += got == round_bf16(float(sum));
    }
  EXPECT_GE(exact, hc * d * 99 / 100);
}

// Hand cases, hc = 2, exact: comb[i][j] weighs stream i into stream j.
//   comb = I, post = 0:           out = X
//   comb = [[0, 1], [0, 0]], post = 0: out_0 = 0, out_1 = X_0
//   comb = 0, post = (1, 0.5):    out_0 = f, out_1 = f / 2
TEST(OpsHcPost, HandComputedOrientation) {
  const int hc = 2, d = 3;
  const std::vector<float> X = {1, -2, 0.5f, 3, 4, -8}, f = {2, 6, -1};
  std::vector<float> out(6);
  std::vector<float> post = {0, 0}, comb = {1, 0, 0, 1};
  hc_post(f.data(), X.data(), post.data(), comb.data(), hc, d, out.data());
  EXPECT_EQ(out, X);
  comb = {0, 1, 0, 0};
  hc_post(f.data(), X.data(), post.data(), comb.data(), hc, d, out.data());
  EXPECT_EQ(out, std::vector<float>({0, 0, 0, 1, -2, 0.5f}));
  comb = {0, 0, 0, 0};
  post = {1, 0.5f};
  hc_post(f.data(), X.data(), post.data(), comb.data(), hc, d, out.data());
  EXPECT_EQ(out, std::vector<float>({2, 6, -1, 1, 3, -0.5f}));
}

}  // namespace
}  // namespace dsv41
