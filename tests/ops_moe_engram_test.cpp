// Unit tests of src/backend/cpu/moe.h (routing, the clamped SwiGLU expert) and engram.h (the fp8
// table gather and the per-stream gate), against naive versions and hand-computed cases.
//
// Reference: model.py Gate.forward (fp32 logits / gate_temp, sqrt(softplus) or sigmoid scores, the
// bias added for the top-k choice only, weights gathered from the unbiased scores, normalized by
// their sum + 1e-20 when topk > 1, times route_scale), Expert.forward (gate = w1 x, up = w3 x as
// bf16 linear outputs, up clamped to [-L, L] and gate to at most L, silu(gate) · up, times the
// routing weight, to bf16, then w2), ParallelEngramEmbedding.forward (e4m3 × ue8m0 per 32, to
// bf16) and Engram.forward (per-stream rsqrt-normalized dot with its key, signed sqrt clamped at
// 1e-6, sigmoid, h + gate · value to bf16).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/engram.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/moe.h"
#include "base/error.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::f32_view;
using test::kF32Unit;
using test::make_weight;
using test::OwnedWeight;

// ---- route ----

double softplus(double x) { return std::log1p(std::exp(x)); }
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

struct NaiveRoute {
  std::vector<int32_t> experts;
  std::vector<double> weights, weight_tol, biased;
  double min_margin = INFINITY;  // smallest gap between the k-th and (k+1)-th biased score
  double logit_error = 0;        // bound on the fp32 error of a logit
};

NaiveRoute naive_route(const std::vector<float>& x, int64_t rows, const OwnedWeight& gate, const std::vector<float>& bias,
                       const GateOptions& opt, const int32_t* forced = nullptr) {
  const int64_t E = gate.rows, dim = gate.cols;
  const int k = opt.topk;
  NaiveRoute r;
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<double> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      double l = 0, abs_l = 0;
      for (int64_t c = 0; c < dim; ++c) {
        l += double(x[size_t(row * dim + c)]) * gate.at(e, c);
        abs_l += std::fabs(double(x[size_t(row * dim + c)]) * gate.at(e, c));
      }
      r.logit_error = std::max(r.logit_error, double(dim) * kF32Unit * abs_l);
      l /= opt.gate_temp;
      score[size_t(e)] = opt.score_func == "sigmoid" ? sigmoid(l) : std::sqrt(softplus(l));
      biased[size_t(e)] = score[size_t(e)] + bias[size_t(e)];
      r.biased.push_back(biased[size_t(e)]);
    }
    std::vector<int32_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return biased[size_t(a)] > biased[size_t(b)]; });
    if (k < E) r.min_margin = std::min(r.min_margin, biased[size_t(order[size_t(k - 1)])] - biased[size_t(order[size_t(k)])]);
    if (forced) std::copy_n(forced + row * k, k, order.begin());
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += score[size_t(order[size_t(j)])];
    for (int j = 0; j < k; ++j) {
      r.experts.push_back(order[size_t(j)]);
      const double s = score[size_t(order[size_t(j)])];
      const bool normalized = opt.norm_topk_prob && k > 1;
      const double w = (normalized ? s / (sum + 1e-20) : s) * opt.route_scale;
      r.weights.push_back(w);
      // a score moves by at most the logit's error (its slope in the logit is below 1); the weight
      // by that relative to its score, and to the sum of the k scores when normalized; plus 16 fp32
      // units for softplus, sqrt, the sum, the division and the scale
      const double dl = r.logit_error / opt.gate_temp;
      r.weight_tol.push_back(std::fabs(w) * (dl / s + (normalized ? k * dl / sum : 0) + 16 * kF32Unit));
    }
  }
  return r;
}

struct RouteCase {
  int64_t rows = 6, dim = 64, E = 16;
  std::vector<float> x, bias;
  OwnedWeight gate;
};

RouteCase route_case(uint32_t seed) {
  RouteCase c;
  c.x = bf16_normal(size_t(c.rows * c.dim), 1.0, seed);
  c.gate = make_weight(WeightFormat::BF16, bf16_normal(size_t(c.E * c.dim), 0.15, seed + 1), int(c.E), int(c.dim));
  std::mt19937 rng(seed + 2);
  std::normal_distribution<float> normal(0, 0.4f);
  c.bias.resize(size_t(c.E));
  for (float& b : c.bias) b = normal(rng);
  return c;
}

// Against the double version. The expert choice must be identical: the test first checks that no
// choice is a near-tie (every k-th vs (k+1)-th gap above 1e-4, while a logit's worst-case fp32
// error γ_dim · Σ|x w| is ~2e-5 here). Weights: see naive_route's weight_tol. The biased scores:
// the logit error plus 8 fp32 units.
void expect_route(const RouteCase& c, const GateOptions& opt, uint32_t salt, const int32_t* forced = nullptr) {
  const Weight bias = f32_view(c.bias, 1, c.E);
  std::vector<int32_t> experts(size_t(c.rows * opt.topk));
  std::vector<float> weights(size_t(c.rows * opt.topk)), biased(size_t(c.rows * c.E));
  route(c.x.data(), c.rows, c.gate.view(), bias, opt, experts.data(), weights.data(), biased.data(), forced);
  const NaiveRoute ref = naive_route(c.x, c.rows, c.gate, c.bias, opt, forced);
  ASSERT_GT(ref.min_margin, 1e-4) << "the data has a near-tie; pick another seed (" << salt << ")";
  EXPECT_EQ(experts, ref.experts) << opt.score_func << " k " << opt.topk;
  for (size_t i = 0; i < weights.size(); ++i)
    EXPECT_NEAR(weights[i], ref.weights[i], ref.weight_tol[i]) << opt.score_func << " weight " << i;
  for (size_t i = 0; i < biased.size(); ++i)
    EXPECT_NEAR(biased[i], ref.biased[i], ref.logit_error + 8 * kF32Unit * std::fabs(ref.biased[i])) << "biased " << i;
}

TEST(OpsRoute, SqrtSoftplusMatchesNaive) {
  const RouteCase c = route_case(1);
  GateOptions opt;
  opt.topk = 6;
  opt.route_scale = 2.5f;
  expect_route(c, opt, 1);
  opt.topk = 1;  // one expert: no normalization (the reference's `topk > 1`)
  expect_route(c, opt, 1);
  opt.topk = 6;
  opt.norm_topk_prob = false;
  expect_route(c, opt, 1);
  opt.norm_topk_prob = true;
  opt.gate_temp = 2.0f;
  expect_route(c, opt, 1);
}

TEST(OpsRoute, SigmoidMatchesNaive) {
  const RouteCase c = route_case(10);
  GateOptions opt;
  opt.topk = 4;
  opt.score_func = "sigmoid";
  opt.route_scale = 1.5f;
  expect_route(c, opt, 10);
}

// Forced experts (the test hook that replays the reference's choices) are taken as given, in the
// given order, and weighted by their own unbiased scores normalized over the forced set.
TEST(OpsRoute, ForcedExpertsAreWeightedTheSameWay) {
  const RouteCase c = route_case(20);
  GateOptions opt;
  opt.topk = 3;
  opt.route_scale = 2.0f;
  std::vector<int32_t> forced;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int j = 0; j < opt.topk; ++j) forced.push_back(int32_t((r * 5 + j * 7) % c.E));
  expect_route(c, opt, 20, forced.data());
}

// Hand case, dim 1, x = 1, so the logits are the gate's column: (0, 2, 25, -3). sqrt(softplus):
// sqrt(ln 2) = 0.83255461, sqrt(ln(1 + e^2)) = 1.45839913, 5 (above softplus' threshold 20 it is
// the identity), sqrt(ln(1 + e^-3)) = 0.22042539.
//  * no bias, k = 2: experts (2, 1), weights 5 / 6.45839913 and 1.45839913 / 6.45839913;
//  * bias (10, 0, 0, 0): expert 0 is chosen by the bias, but weighted by its unbiased score:
//    experts (0, 2), weights 0.83255461 / 5.83255461 and 5 / 5.83255461;
//  * route_scale 3 multiplies after the normalization; without normalization the raw scores.
TEST(OpsRoute, HandComputedBiasSteersSelectionOnly) {
  const std::vector<float> x = {1}, w = {0, 2, 25, -3};
  const Weight gate = f32_view(w, 4, 1);
  const double s0 = 0.8325546111576977, s1 = 1.4583991261115636, s2 = 5, s3 = 0.2204253877704246;
  GateOptions opt;
  opt.topk = 2;
  int32_t experts[2];
  float weights[2], biased[4];
  const double tol = 8 * kF32Unit;

  std::vector<float> b = {0, 0, 0, 0};
  route(x.data(), 1, gate, f32_view(b, 1, 4), opt, experts, weights, biased);
  EXPECT_EQ(experts[0], 2);
  EXPECT_EQ(experts[1], 1);
  EXPECT_NEAR(weights[0], s2 / (s2 + s1), tol);
  EXPECT_NEAR(weights[1], s1 / (s2 + s1), tol);
  const double scores[4] = {s0, s1, s2, s3};
  for (int e = 0; e < 4; ++e) EXPECT_NEAR(biased[e], scores[e], tol * 5) << e;

  b = {10, 0, 0, 0};
  route(x.data(), 1, gate, f32_view(b, 1, 4), opt, experts, weights, biased);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 2);
  EXPECT_NEAR(weights[0], s0 / (s0 + s2), tol);
  EXPECT_NEAR(weights[1], s2 / (s0 + s2), tol);
  EXPECT_NEAR(biased[0], 10 + s0, tol * 10);

  opt.route_scale = 3;
  route(x.data(), 1, gate, f32_view(b, 1, 4), opt, experts, weights);
  EXPECT_NEAR(weights[0], 3 * s0 / (s0 + s2), 3 * tol);
  EXPECT_NEAR(weights[0] + weights[1], 3.0, 3 * tol);
  opt.norm_topk_prob = false;
  route(x.data(), 1, gate, f32_view(b, 1, 4), opt, experts, weights);
  EXPECT_NEAR(weights[0], 3 * s0, 3 * tol);
  EXPECT_NEAR(weights[1], 3 * s2, 3 * tol * 5);

  // equal biased scores: the lower expert first (torch.topk leaves ties unspecified)
  const std::vector<float> tie = {1, 1, 1, 1};
  opt.norm_topk_prob = true;
  opt.route_scale = 1;
  b = {0, 0, 0, 0};
  route(x.data(), 1, f32_view(tie, 4, 1), f32_view(b, 1, 4), opt, experts, weights);
  EXPECT_EQ(experts[0], 0);
  EXPECT_EQ(experts[1], 1);
  EXPECT_EQ(weights[0], 0.5f);
}

// V4.1's gate is sqrtsoftplus; softmax is a V3 gate the engine refuses by name.
TEST(OpsRoute, SoftmaxIsRefused) {
  const std::vector<float> x = {1}, w = {0, 1}, b = {0, 0};
  GateOptions opt;
  opt.topk = 1;
  opt.score_func = "softmax";
  int32_t e;
  float wt;
  EXPECT_THROW(route(x.data(), 1, f32_view(w, 2, 1), f32_view(b, 1, 2), opt, &e, &wt), Error);
}

// ---- expert_ffn ----

// Data on which the two projections are exact: x multiples of 1/4 with at most two significant
// bits (0, ±1/4, ±1/2, ±3/4, ±1, ±3/2, ±2), which act_quant's e4m3 keeps exactly at any of its
// power-of-two block scales, and weights e2m1 × 2^-3 (exact in fp4, fp8 and bf16). Every product
// is then a multiple of 2^-6 below 2 and every partial sum of 64 of them stays far below 2^18
// units: w1 x and w3 x are exact in fp32 in any order, so the op and the naive version round the
// same numbers to bf16. What remains to compare is the SwiGLU itself.
std::vector<float> expert_input(size_t n, uint32_t seed) {
  static const float values[] = {0, 0.25f, 0.5f, 0.75f, 1, 1.5f, 2};
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    const uint32_t r = rng();
    v = (r & 1 ? -1.0f : 1.0f) * values[(r >> 1) % 7];
  }
  return x;
}


std::vector<float> identity(int n) {
  std::vector<float> I(size_t(n) * n, 0.0f);
  for (int i = 0; i < n; ++i) I[size_t(i) * n + i] = 1.0f;
  return I;
}

// h = bf16(weight · silu(min(g, L)) · clamp(u, -L, L)) in double, g and u the bf16 projections.
double naive_swiglu(double g, double u, double limit, double weight) {
  if (limit > 0) {
    u = std::clamp(u, -limit, limit);
    g = std::min(g, limit);
  }
  return weight * (g * sigmoid(g)) * u;
}

// With w2 the identity (bf16), y = linear(h, I) = h exactly (each output is h_n · 1 plus zeros),
// which exposes the SwiGLU output. Tolerance: one bf16 ulp of the exact value (h is rounded to
// bf16 by both; the op's fp32 silu, a few units off, can land on the neighbour) plus 8 fp32 units.
TEST(OpsExpertFfn, SwigluMatchesNaiveThroughAnIdentityW2) {
  const int rows = 3, dim = 64;
  const std::vector<float> x = expert_input(size_t(rows) * dim, 1);
  const OwnedWeight w2 = make_weight(WeightFormat::BF16, identity(dim), dim, dim);
  const std::vector<float> row_weights = {0.3f, 1.0f, 2.7f};
  const std::vector<float> w1v = test::e2m1_eighths(size_t(dim) * dim, 2), w3v = test::e2m1_eighths(size_t(dim) * dim, 3);
  for (WeightFormat f : {WeightFormat::FP4, WeightFormat::FP8, WeightFormat::BF16}) {
    const OwnedWeight w1 = make_weight(f, w1v, dim, dim);
    const OwnedWeight w3 = make_weight(f, w3v, dim, dim);
    ASSERT_EQ(w1.values, w1v) << "the weights must hold the values exactly";
    ASSERT_EQ(w3.values, w3v);
    // the exact projections, rounded to bf16 as linear's output is
    std::vector<double> g(size_t(rows) * dim), u(size_t(rows) * dim);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < dim; ++i) {
        double a = 0, b = 0;
        for (int k = 0; k < dim; ++k) {
          a += double(x[size_t(r * dim + k)]) * w1.at(i, k);
          b += double(x[size_t(r * dim + k)]) * w3.at(i, k);
        }
        g[size_t(r * dim + i)] = round_bf16(float(a));
        u[size_t(r * dim + i)] = round_bf16(float(b));
      }
    for (float limit : {0.0f, 2.5f})
      for (bool weighted : {false, true}) {
        std::vector<float> y(size_t(rows) * dim);
        expert_ffn(x.data(), rows, w1.view(), w2.view(), w3.view(), limit, weighted ? row_weights.data() : nullptr,
                   y.data());
        int exact = 0, gate_high = 0, gate_low = 0, up_high = 0, up_low = 0;
        for (int r = 0; r < rows; ++r)
          for (int i = 0; i < dim; ++i) {
            const size_t at = size_t(r * dim + i);
            const double h = naive_swiglu(g[at], u[at], limit, weighted ? row_weights[size_t(r)] : 1.0);
            ASSERT_NEAR(y[at], h, bf16_ulp(h) + 8 * kF32Unit * std::fabs(h))
                << test::format_name(f) << " limit " << limit << " weighted " << weighted << " row " << r << " i " << i;
            exact += y[at] == round_bf16(float(h));
            gate_high += g[at] > 2.5;
            gate_low += g[at] < -2.5;
            up_high += u[at] > 2.5;
            up_low += u[at] < -2.5;
          }
        EXPECT_GE(exact, rows * dim * 95 / 100);
        // the clamps were exercised on every side (the gate's low side must pass unclamped)
        EXPECT_GT(gate_high, 5);
        EXPECT_GT(gate_low, 5);
        EXPECT_GT(up_high, 5);
        EXPECT_GT(up_low, 5);
      }
  }
}

// Hand case, limit 2: x = e_0, so gate_i = w1[i][0] and up_i = w3[i][0]; w2 = I.
//   (g, u) = (5, 3):     silu(min(5, 2)) · clamp(3)  = silu(2) · 2    = 3.52318831
//   (g, u) = (-5, -3):   silu(-5) · clamp(-3)        = silu(-5) · -2  = 0.06692851 (gate not clamped below)
//   (g, u) = (1, 1.5):   silu(1) · 1.5                                = 1.09658787
//   (g, u) = (0.5, -2.5): silu(0.5) · -2                               = -0.62245933
// and without a limit: 14.89960724, 0.10039276, 1.09658787, -0.77807416. Each to bf16.
TEST(OpsExpertFfn, HandComputedClamps) {
  const int dim = 32;
  std::vector<float> x(dim, 0.0f), w1(size_t(dim) * dim, 0.0f), w3(size_t(dim) * dim, 0.0f);
  x[0] = 1;
  const float g[4] = {5, -5, 1, 0.5f}, u[4] = {3, -3, 1.5f, -2.5f};
  for (int i = 0; i < 4; ++i) {
    w1[size_t(i) * dim] = g[i];
    w3[size_t(i) * dim] = u[i];
  }
  const OwnedWeight W1 = make_weight(WeightFormat::BF16, w1, dim, dim), W3 = make_weight(WeightFormat::BF16, w3, dim, dim),
                    W2 = make_weight(WeightFormat::BF16, identity(dim), dim, dim);
  std::vector<float> y(dim);
  expert_ffn(x.data(), 1, W1.view(), W2.view(), W3.view(), 2.0f, nullptr, y.data());
  const double clamped[4] = {3.5231883119115293, 0.06692850924284856, 1.0965878679450074, -0.6224593312018546};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], round_bf16(float(clamped[i]))) << i;
  for (int i = 4; i < dim; ++i) EXPECT_EQ(y[i], 0.0f) << i;
  expert_ffn(x.data(), 1, W1.view(), W2.view(), W3.view(), 0.0f, nullptr, y.data());
  const double unclamped[4] = {14.89960723613573, 0.10039276386427284, 1.0965878679450074, -0.7780741640023182};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[i], round_bf16(float(unclamped[i]))) << i;
  // the routing weight multiplies before the bf16 rounding: 0.5 · 3.5231883 = 1.76159416
  const float half = 0.5f;
  expert_ffn(x.data(), 1, W1.view(), W2.view(), W3.view(), 2.0f, &half, y.data());
  EXPECT_EQ(y[0], round_bf16(float(0.5 * clamped[0])));
}

// With a real w2 the output is w2 applied (through linear, so act_quant for fp4 / fp8) to the bf16
// SwiGLU: bit for bit linear(h, w2), h read off the identity run.
TEST(OpsExpertFfn, W2IsLinearOfTheBf16Swiglu) {
  const int rows = 2, dim = 64, inter = 96;
  const std::vector<float> x = bf16_normal(size_t(rows) * dim, 1.0, 30);
  const OwnedWeight w1 = make_weight(WeightFormat::FP4, bf16_normal(size_t(inter) * dim, 0.2, 31), inter, dim);
  const OwnedWeight w3 = make_weight(WeightFormat::FP4, bf16_normal(size_t(inter) * dim, 0.2, 32), inter, dim);
  const OwnedWeight I = make_weight(WeightFormat::BF16, identity(inter), inter, inter);
  const std::vector<float> row_weights = {0.7f, 1.3f};
  std::vector<float> h(size_t(rows) * inter);
  expert_ffn(x.data(), rows, w1.view(), I.view(), w3.view(), 1.5f, row_weights.data(), h.data());
  for (WeightFormat f : {WeightFormat::FP4, WeightFormat::FP8, WeightFormat::BF16}) {
    const OwnedWeight w2 = make_weight(f, bf16_normal(size_t(dim) * inter, 0.2, 33), dim, inter);
    std::vector<float> y(size_t(rows) * dim), expected(size_t(rows) * dim);
    expert_ffn(x.data(), rows, w1.view(), w2.view(), w3.view(), 1.5f, row_weights.data(), y.data());
    linear(h.data(), rows, w2.view(), expected.data());
    EXPECT_EQ(y, expected) << test::format_name(f);
  }
}

// ---- engram_gather ----

// OCP e4m3 decoded from its bit fields here (S.EEEE.MMM, bias 7, exponent 0 subnormal).
double e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const double magnitude = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (code & 0x80) ? -magnitude : magnitude;
}

// Each gathered value is e4m3 × 2^(s - 127): at most 4 significant bits, exact in bf16, so the
// comparison is exact. Rows gathered in any order, repeated.
TEST(OpsEngramGather, DequantizesRowsExactly) {
  const int rows = 10, hd = 64;
  std::mt19937 rng(40);
  std::vector<uint8_t> table(size_t(rows) * hd), scales(size_t(rows) * hd / 32);
  for (uint8_t& b : table) {
    do b = uint8_t(rng()); while ((b & 0x7F) == 0x7F);  // no NaN codes
  }
  for (uint8_t& s : scales) s = uint8_t(112 + rng() % 24);  // 2^-15 .. 2^8
  const std::vector<int64_t> ids = {3, 0, 9, 3, 7};
  std::vector<float> out(ids.size() * hd);
  engram_gather(table.data(), scales.data(), hd, ids.data(), int(ids.size()), out.data());
  for (size_t c = 0; c < ids.size(); ++c)
    for (int i = 0; i < hd; ++i) {
      const double v = e4m3_value(table[size_t(ids[c]) * hd + i]) * std::ldexp(1.0, scales[size_t(ids[c]) * 2 + i / 32] - 127);
      ASSERT_EQ(out[c * hd + i], v) << "column " << c << " value " << i;
    }
}

// ---- engram_gate ----

struct NaiveGate {
  std::vector<double> out, tol;
};

// X_m + σ(signed_sqrt(dot_m)) · value in double, dot_m = Σ h qk key · rsqrt(mean h² + eps)
// · rsqrt(mean key² + eps) / sqrt(d), signed_sqrt(x) = sign(x) sqrt(max(|x|, 1e-6)).
// Tolerance: the fp32 dot errs by Δ <= (d + 8) · 2^-24 · Σ|h qk key| · rstd / sqrt(d); the square
// root amplifies it by 1 / (2 sqrt(|dot|)) (at most 500, at the clamp); σ' <= 1/4; so the gate
// errs by Δg <= Δ / (8 sqrt(max(|dot| - Δ, 1e-6))) + 4 u, the output by Δg · |value| plus its bf16
// rounding (one ulp of the exact value) and 2 u of the sum.
NaiveGate naive_gate(const std::vector<float>& X, const std::vector<float>& kv, const std::vector<float>& qk, int hc,
                     int d, double eps) {
  NaiveGate r;
  const float* value = kv.data() + size_t(hc) * d;
  for (int m = 0; m < hc; ++m) {
    const float* h = X.data() + size_t(m) * d;
    const float* key = kv.data() + size_t(m) * d;
    double hh = 0, kk = 0, dot = 0, abs_dot = 0;
    for (int i = 0; i < d; ++i) {
      hh += double(h[i]) * h[i];
      kk += double(key[i]) * key[i];
      dot += double(h[i]) * qk[size_t(m) * d + i] * key[i];
      abs_dot += std::fabs(double(h[i]) * qk[size_t(m) * d + i] * key[i]);
    }
    const double rstd = 1 / std::sqrt(hh / d + eps) / std::sqrt(kk / d + eps);
    dot *= rstd / std::sqrt(double(d));
    const double delta = (d + 8) * kF32Unit * abs_dot * rstd / std::sqrt(double(d));
    const double root = std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6)), dot);
    const double gate = sigmoid(root);
    const double dg = delta / (8 * std::sqrt(std::max(std::fabs(dot) - delta, 1e-6))) + 4 * kF32Unit;
    for (int i = 0; i < d; ++i) {
      const double o = h[i] + gate * value[i];
      r.out.push_back(o);
      r.tol.push_back(bf16_ulp(o) + dg * std::fabs(value[i]) + 2 * kF32Unit * (std::fabs(h[i]) + std::fabs(value[i])));
    }
  }
  return r;
}

TEST(OpsEngramGate, MatchesNaive) {
  const int hc = 4, d = 64;
  const std::vector<float> X0 = bf16_normal(size_t(hc) * d, 1.0, 50);
  std::vector<float> kv = bf16_normal(size_t(hc + 1) * d, 1.0, 51);
  for (int i = 0; i < d; ++i) kv[size_t(1) * d + i] = X0[size_t(1) * d + i];  // stream 1 agrees with its key
  for (int i = 0; i < d; ++i) kv[size_t(2) * d + i] = round_bf16(-2 * X0[size_t(2) * d + i]);  // 2 opposes it
  const std::vector<float> q = bf16_normal(size_t(hc) * d, 1.0, 52), k = bf16_normal(size_t(hc) * d, 1.0, 53);
  std::vector<float> qk(size_t(hc) * d);
  for (size_t i = 0; i < qk.size(); ++i) qk[i] = q[i] * k[i];  // fp32 product of bf16 parameters
  for (int i = 0; i < d; ++i) qk[size_t(1) * d + i] = qk[size_t(2) * d + i] = 1.0f;
  std::vector<float> X = X0;
  engram_gate(X.data(), kv.data(), qk.data(), hc, d, 1e-20f);
  const NaiveGate ref = naive_gate(X0, kv, qk, hc, d, 1e-20);
  int exact = 0;
  for (size_t i = 0; i < X.size(); ++i) {
    EXPECT_NEAR(X[i], ref.out[i], ref.tol[i]) << "stream " << i / d << " channel " << i % d;
    EXPECT_EQ(X[i], round_bf16(X[i]));
    exact += X[i] == round_bf16(float(ref.out[i]));
  }
  EXPECT_GE(exact, int(X.size()) * 95 / 100);
}

// Hand cases, hc = 2, d = 2, value (2, 2), each stream h = (2^-8, 2^-8):
//  * stream 0, key (1, -1), qk 1: the dot is exactly 0, so the clamp gives σ(+sqrt(1e-6)) =
//    σ(0.001) = 0.50025 and h + 2 · 0.50025 = 1.00440625, above the bf16 midpoint 1.00390625:
//    1.0078125. (Without the clamp: σ(0) = 0.5, exactly the midpoint, to even: 1.)
//  * stream 1, key (1, -1.0078125), qk 2^-24: the dot is a tiny negative number, clamped to
//    -sqrt(1e-6): σ(-0.001) = 0.49975, h + 0.9995 = 1.00340625, below the midpoint: 1.
// A stream equal to its key with qk = 1 and d = 16: the normalized dot is sqrt(d) = 4, the gate
// σ(sqrt 4) = σ(2) = 0.88079708; h = ±1 and value 1 give bf16(1.88079708) and bf16(-0.11920292).
TEST(OpsEngramGate, HandComputedGates) {
  const float h = 0x1p-8f;
  std::vector<float> X = {h, h, h, h};
  const std::vector<float> kv = {1, -1, 1, -1.0078125f, 2, 2};
  const std::vector<float> qk = {1, 1, 0x1p-24f, 0x1p-24f};
  engram_gate(X.data(), kv.data(), qk.data(), 2, 2, 1e-20f);
  EXPECT_EQ(X, std::vector<float>({1.0078125f, 1.0078125f, 1.0f, 1.0f}));

  std::vector<float> Y(16), kv2(32, 1.0f), qk2(16, 1.0f);
  for (int i = 0; i < 16; ++i) Y[size_t(i)] = kv2[size_t(i)] = i % 2 ? -1.0f : 1.0f;
  engram_gate(Y.data(), kv2.data(), qk2.data(), 1, 16, 1e-20f);
  const double g = sigmoid(2);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(Y[size_t(i)], round_bf16(float((i % 2 ? -1 : 1) + g))) << i;
}

}  // namespace
}  // namespace dsv41
