// AdamW (adamw.h) against steps computed by hand, and on a least-squares problem.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "train/optim/adamw.h"
#include "optim_test_util.h"

namespace dsv41::optim {
namespace {

// w₀ = 2, g₁ = 0.5, g₂ = −0.25, η = 0.01, λ = 0.1, β = (0.9, 0.95), ε = 1e-20:
//   step 1: m = 0.05, v = 0.0125; m̂ = 0.05 / 0.1 = 0.5, v̂ = 0.0125 / 0.05 = 0.25
//           w₁ = 2 · (1 − 0.001) − 0.01 · 0.5 / 0.5 = 1.988
//   step 2: m = 0.045 − 0.025 = 0.02, v = 0.011875 + 0.003125 = 0.015
//           m̂ = 0.02 / 0.19 = 2/19, v̂ = 0.015 / 0.0975 = 2/13, m̂ / √v̂ = √26 / 19
//           w₂ = 1.988 · 0.999 − 0.01 · √26 / 19 = 1.98332830551916…
// A second coordinate without gradient only decays; a third, in a group without decay, moves
// by the same Adam steps from 0. Tolerance: values of order 1 after a dozen fp32 operations, each
// rounding by at most 2⁻²⁴ relative: 1e-6.
TEST(AdamW, TwoStepsMatchTheHandComputedValues) {
  std::vector<float> w = {2.0f, 3.0f}, m(2, 0.0f), v(2, 0.0f);
  const float g1[2] = {0.5f, 0.0f}, g2[2] = {-0.25f, 0.0f};
  AdamWOptions o;  // the report's β, ε and λ
  adamw_step(w.data(), g1, m.data(), v.data(), 2, 1, 0.01f, o);
  EXPECT_NEAR(w[0], 1.988, 1e-6);
  adamw_step(w.data(), g2, m.data(), v.data(), 2, 2, 0.01f, o);
  EXPECT_NEAR(w[0], 1.98332830551916, 1e-6);
  EXPECT_NEAR(w[1], 3.0 * 0.999 * 0.999, 1e-6);
  EXPECT_NEAR(m[0], 0.02, 1e-8);
  EXPECT_NEAR(v[0], 0.015, 1e-8);

  float u = 0, mu = 0, vu = 0;
  o.weight_decay = 0;
  adamw_step(&u, g1, &mu, &vu, 1, 1, 0.01f, o);
  adamw_step(&u, g2, &mu, &vu, 1, 2, 0.01f, o);
  EXPECT_NEAR(u, -0.01 - 0.01 * std::sqrt(26.0) / 19, 1e-8);
}

// With ε = 1e-20 the first step is η sign(g) for gradients of any size (m̂ / √v̂ = g / |g|), where
// torch's default ε = 1e-8 would shrink the step of g = 1e-12 ten-thousandfold.
TEST(AdamW, FirstStepIsTheSignOfTheGradient) {
  const float g[4] = {1e-12f, -3e-6f, 0.7f, -2e3f};
  std::vector<float> w(4, 0.0f), m(4, 0.0f), v(4, 0.0f);
  adamw_step(w.data(), g, m.data(), v.data(), 4, 1, 0.01f, AdamWOptions{});
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(w[size_t(i)], g[i] > 0 ? -0.01 : 0.01, 1e-8) << i;
}

TEST(AdamW, RefusesStepZero) {
  float w = 0, g = 1, m = 0, v = 0;
  EXPECT_THROW(adamw_step(&w, &g, &m, &v, 1, 0, 0.01f, AdamWOptions{}), Error);
}

// L(w) = ½ ‖A w − y‖² / n, A [64, 16] Gaussian, y = A w*, w₀ = 0, 100 steps at η = 0.01 with the
// report's hyper-parameters (decay included): every step lowers the loss, and 100 more than
// halve it (each coordinate moves by about η per step towards w*, at distance ~1).
TEST(AdamW, LeastSquaresLossFallsEveryStep) {
  const int64_t n = 64, d = 16;
  const std::vector<float> A = test::gaussian(size_t(n * d), 1.0, 31), wstar = test::gaussian(size_t(d), 1.0, 32);
  std::vector<float> w(size_t(d), 0.0f), m(w.size(), 0.0f), v(w.size(), 0.0f), g(w.size());
  std::vector<double> r(static_cast<size_t>(n));
  auto loss = [&] {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) {
      double x = 0;
      for (int64_t k = 0; k < d; ++k) x += double(A[size_t(i * d + k)]) * (w[size_t(k)] - wstar[size_t(k)]);
      r[size_t(i)] = x;
      l += 0.5 * x * x / double(n);
    }
    return l;
  };
  double current = loss();
  const double first = current;
  for (int64_t step = 1; step <= 100; ++step) {
    for (int64_t k = 0; k < d; ++k) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += r[size_t(i)] * A[size_t(i * d + k)];
      g[size_t(k)] = float(s / double(n));
    }
    adamw_step(w.data(), g.data(), m.data(), v.data(), d, step, 0.01f, AdamWOptions{});
    const double next = loss();
    ASSERT_LT(next, current) << "step " << step;
    current = next;
  }
  EXPECT_LT(current, 0.5 * first);
}

}  // namespace
}  // namespace dsv41::optim
