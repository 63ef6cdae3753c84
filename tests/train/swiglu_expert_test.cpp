// src/train/grad/swiglu_expert.h: the clamped SwiGLU expert's backward against central differences
// (input, the three weights, the routing weight), clamped and not, and its forward against the
// CPU op (backend/cpu/moe.h expert_ffn).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/moe.h"
#include "gradcheck.h"
#include "train/grad/swiglu_expert.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

struct ExpertCase {
  int64_t rows = 3, dim = 6, inter = 5;
  std::vector<double> x, w1, w2, w3, row_weights;
};

ExpertCase random_expert(uint32_t seed) {
  ExpertCase e;
  e.x = normal_values(size_t(e.rows * e.dim), 1.0, seed);
  e.w1 = normal_values(size_t(e.inter * e.dim), 0.6, seed + 1);
  e.w2 = normal_values(size_t(e.dim * e.inter), 0.6, seed + 2);
  e.w3 = normal_values(size_t(e.inter * e.dim), 0.6, seed + 3);
  e.row_weights = {0.7, 1.3, 0.2};
  return e;
}

// Checks every gradient of the expert at `limit` (0: no clamp). With a clamp, the data must keep
// every pre-activation at least 1e-3 from a bound it could cross (100 steps h at the data's scale,
// so no central difference straddles a kink) and must clamp some of each branch, or the clamps'
// backward would go unchecked.
void check_expert(ExpertCase& e, double limit, bool weighted) {
  const std::vector<double> c = normal_values(size_t(e.rows * e.dim), 1.0, 99);
  std::vector<double> y(c.size());
  grad::ExpertSaved<double> saved;
  const double* rw = weighted ? e.row_weights.data() : nullptr;
  auto loss = [&] {
    grad::expert_forward(e.x.data(), e.rows, e.dim, e.w1.data(), e.w2.data(), e.w3.data(), e.inter, limit,
                         weighted ? e.row_weights.data() : nullptr, y.data(), saved);
    return weighted_sum(c, y);
  };
  loss();
  if (limit > 0) {
    int clamped_g = 0, clamped_u = 0;
    for (size_t i = 0; i < saved.gate.size(); ++i) {
      ASSERT_GT(std::fabs(saved.gate[i] - limit), 1e-3) << "gate " << i << " sits on the clamp";
      ASSERT_GT(std::fabs(std::fabs(saved.up[i]) - limit), 1e-3) << "up " << i << " sits on the clamp";
      clamped_g += saved.gate[i] > limit;
      clamped_u += std::fabs(saved.up[i]) > limit;
    }
    ASSERT_GT(clamped_g, 0);
    ASSERT_GT(clamped_u, 0);
  }
  std::vector<double> dx(e.x.size(), 0.0), dw1(e.w1.size(), 0.0), dw2(e.w2.size(), 0.0), dw3(e.w3.size(), 0.0),
      drw(e.row_weights.size(), 0.0);
  grad::expert_backward(e.x.data(), e.rows, e.dim, e.w1.data(), e.w2.data(), e.w3.data(), e.inter, limit, rw, saved,
                        c.data(), dx.data(), dw1.data(), dw2.data(), dw3.data(), weighted ? drw.data() : nullptr);
  expect_gradient("dx", e.x, dx, loss);
  expect_gradient("dw1", e.w1, dw1, loss);
  expect_gradient("dw2", e.w2, dw2, loss);
  expect_gradient("dw3", e.w3, dw3, loss);
  if (weighted) expect_gradient("drow_weights", e.row_weights, drw, loss);
}

TEST(GradSwigluExpert, ClampedGradientsMatchCentralDifferences) {
  ExpertCase e = random_expert(1);
  check_expert(e, 1.0, true);
}

TEST(GradSwigluExpert, UnclampedGradientsMatchCentralDifferences) {
  ExpertCase e = random_expert(11);
  check_expert(e, 0.0, false);
}

// A clamped element's gradient is zero: an input that moves only clamped pre-activations moves
// nothing (gate 3 > L = 1 and up −2 < −L: h = silu(1) · (−1) whatever x is nearby).
TEST(GradSwigluExpert, ClampedElementsPassNoGradient) {
  const std::vector<double> x = {1.0}, w1 = {3.0}, w3 = {-2.0}, w2 = {1.0};
  std::vector<double> y(1);
  grad::ExpertSaved<double> saved;
  grad::expert_forward<double>(x.data(), 1, 1, w1.data(), w2.data(), w3.data(), 1, 1.0, nullptr, y.data(), saved);
  EXPECT_NEAR(y[0], -1.0 / (1 + std::exp(-1.0)), 1e-15);
  std::vector<double> dx(1, 0.0), dw1(1, 0.0), dw2(1, 0.0), dw3(1, 0.0);
  const std::vector<double> dy = {1.0};
  grad::expert_backward<double>(x.data(), 1, 1, w1.data(), w2.data(), w3.data(), 1, 1.0, nullptr, saved, dy.data(),
                                dx.data(), dw1.data(), dw2.data(), dw3.data(), nullptr);
  EXPECT_EQ(dx[0], 0.0);
  EXPECT_EQ(dw1[0], 0.0);
  EXPECT_EQ(dw3[0], 0.0);
  EXPECT_NEAR(dw2[0], y[0], 1e-15);
}

// The CPU op with bf16 weights: g and u are fp32 products rounded to bf16 (each off by
// δ = K fp32 units of Σ|x w| plus half a bf16 ulp); h = w · silu(g) · u moves by at most
// w (1.1 δg |u| + |silu(g)| δu + 1.1 δg δu) (|silu'| < 1.1, the clamps are 1-Lipschitz), plus 4
// fp32 units and half a bf16 ulp of its own rounding; y = W2 h by Σ_i |W2_i| Δh_i, an fp32 product
// error and its bf16 rounding.
TEST(GradSwigluExpert, ForwardMatchesTheCpuOp) {
  const int64_t rows = 4, dim = 64, inter = 32;
  const float limit = 2.0f;
  const std::vector<float> xf = test::bf16_normal(size_t(rows * dim), 1.0, 21);
  const std::vector<float> w1f = test::bf16_normal(size_t(inter * dim), 0.2, 22), w3f = test::bf16_normal(size_t(inter * dim), 0.2, 23);
  const std::vector<float> w2f = test::bf16_normal(size_t(dim * inter), 0.2, 24);
  const std::vector<float> rwf = {0.5f, 1.0f, 0.25f, 0.75f};
  const test::OwnedWeight W1 = test::make_weight(WeightFormat::BF16, w1f, int(inter), int(dim));
  const test::OwnedWeight W2 = test::make_weight(WeightFormat::BF16, w2f, int(dim), int(inter));
  const test::OwnedWeight W3 = test::make_weight(WeightFormat::BF16, w3f, int(inter), int(dim));
  std::vector<float> y_cpu(size_t(rows * dim));
  expert_ffn(xf.data(), rows, W1.view(), W2.view(), W3.view(), limit, rwf.data(), y_cpu.data());

  const std::vector<double> x(xf.begin(), xf.end()), w1(W1.values.begin(), W1.values.end()), w2(W2.values.begin(), W2.values.end()),
      w3(W3.values.begin(), W3.values.end()), rw(rwf.begin(), rwf.end());
  std::vector<double> y(size_t(rows * dim));
  grad::ExpertSaved<double> saved;
  grad::expert_forward(x.data(), rows, dim, w1.data(), w2.data(), w3.data(), inter, double(limit), rw.data(), y.data(), saved);
  int clamped = 0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> dh(static_cast<size_t>(inter));
    for (int64_t i = 0; i < inter; ++i) {
      double abs_g = 0, abs_u = 0;
      for (int64_t k = 0; k < dim; ++k) {
        abs_g += std::fabs(x[size_t(r * dim + k)] * w1[size_t(i * dim + k)]);
        abs_u += std::fabs(x[size_t(r * dim + k)] * w3[size_t(i * dim + k)]);
      }
      const double g = saved.gate[size_t(r * inter + i)], u0 = saved.up[size_t(r * inter + i)];
      clamped += g > limit || std::fabs(u0) > limit;
      const double eg = dim * test::kF32Unit * abs_g, eu = dim * test::kF32Unit * abs_u;
      const double dg = eg + 0.5 * test::bf16_ulp(std::fabs(g) + eg), du = eu + 0.5 * test::bf16_ulp(std::fabs(u0) + eu);
      const double gc = std::min(g, double(limit)), uc = std::clamp(u0, -double(limit), double(limit));
      const double h = saved.hidden[size_t(r * inter + i)];
      const double move = rw[size_t(r)] * (1.1 * dg * std::fabs(uc) + std::fabs(gc / (1 + std::exp(-gc))) * du + 1.1 * dg * du);
      dh[size_t(i)] = move + 4 * test::kF32Unit * std::fabs(h) + 0.5 * test::bf16_ulp(std::fabs(h) + move);
    }
    for (int64_t n = 0; n < dim; ++n) {
      double spread = 0, abs_y = 0;
      for (int64_t i = 0; i < inter; ++i) {
        spread += std::fabs(w2[size_t(n * inter + i)]) * dh[size_t(i)];
        abs_y += std::fabs(w2[size_t(n * inter + i)] * saved.hidden[size_t(r * inter + i)]);
      }
      const double v = y[size_t(r * dim + n)], delta = spread + inter * test::kF32Unit * abs_y;
      EXPECT_NEAR(y_cpu[size_t(r * dim + n)], v, delta + 0.5 * test::bf16_ulp(std::fabs(v) + delta)) << r << "," << n;
    }
  }
  EXPECT_GT(clamped, 0) << "the data should reach the clamps";
}

}  // namespace
}  // namespace dsv41
