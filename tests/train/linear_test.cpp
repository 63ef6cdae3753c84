// src/train/grad/linear.h: the backward of the plain and the grouped linear against central
// differences (input and weight), and the forward against the CPU's fp32 and bf16 products.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/linear.h"
#include "gradcheck.h"
#include "train/grad/linear.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

TEST(GradLinear, GradientsMatchCentralDifferences) {
  const int64_t M = 3, K = 7, N = 5;
  std::vector<double> x = normal_values(size_t(M * K), 1.0, 1), W = normal_values(size_t(N * K), 0.5, 2);
  const std::vector<double> c = normal_values(size_t(M * N), 1.0, 3);
  std::vector<double> y(size_t(M * N));
  auto loss = [&] {
    grad::linear_forward(x.data(), M, K, W.data(), N, y.data());
    return weighted_sum(c, y);
  };
  std::vector<double> dx(x.size(), 0.0), dW(W.size(), 0.0);
  grad::linear_backward(x.data(), M, K, W.data(), N, c.data(), dx.data(), dW.data());
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dW", W, dW, loss);
}

TEST(GradLinear, GroupedGradientsMatchCentralDifferences) {
  const int64_t M = 2, G = 3, Kg = 4, Ng = 2;
  std::vector<double> x = normal_values(size_t(M * G * Kg), 1.0, 4), W = normal_values(size_t(G * Ng * Kg), 0.5, 5);
  const std::vector<double> c = normal_values(size_t(M * G * Ng), 1.0, 6);
  std::vector<double> y(c.size());
  auto loss = [&] {
    grad::linear_grouped_forward(x.data(), M, G, Kg, W.data(), Ng, y.data());
    return weighted_sum(c, y);
  };
  std::vector<double> dx(x.size(), 0.0), dW(W.size(), 0.0);
  grad::linear_grouped_backward(x.data(), M, G, Kg, W.data(), Ng, c.data(), dx.data(), dW.data());
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dW", W, dW, loss);
}

// Group g reads only its own slice of x: the grouped product is the block-diagonal one.
TEST(GradLinear, GroupedIsBlockDiagonal) {
  const int64_t G = 2, Kg = 3, Ng = 2;
  const std::vector<double> x = {1, 2, 3, 4, 5, 6};
  const std::vector<double> W = {1, 0, 0, 0, 1, 0, /* group 1 */ 0, 0, 1, 1, 1, 1};
  std::vector<double> y(4);
  grad::linear_grouped_forward(x.data(), 1, G, Kg, W.data(), Ng, y.data());
  EXPECT_EQ(y, (std::vector<double>{1, 2, 6, 15}));
}

// The CPU's fp32 product errs by at most γ_K Σ_k |x_k w_k| ≈ K fp32 units of Σ|x w|, in any
// summation order (the depth of any order's sum tree is at most K); the bf16 product rounds that
// to bf16, half a bf16 ulp more.
TEST(GradLinear, ForwardMatchesTheCpuProducts) {
  const int64_t M = 3, K = 96, N = 40;
  const std::vector<float> xf = test::bf16_normal(size_t(M * K), 1.0, 7), wf = test::bf16_normal(size_t(N * K), 0.2, 8);
  const test::OwnedWeight w32 = test::make_weight(WeightFormat::F32, wf, int(N), int(K));
  const test::OwnedWeight w16 = test::make_weight(WeightFormat::BF16, wf, int(N), int(K));
  std::vector<float> y32(size_t(M * N)), y16(size_t(M * N));
  linear_f32(xf.data(), M, w32.view(), y32.data());
  linear(xf.data(), M, w16.view(), y16.data());
  const std::vector<double> x(xf.begin(), xf.end()), W(wf.begin(), wf.end());
  std::vector<double> y(size_t(M * N));
  grad::linear_forward(x.data(), M, K, W.data(), N, y.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double abs_sum = 0;
      for (int64_t k = 0; k < K; ++k) abs_sum += std::fabs(x[size_t(m * K + k)] * W[size_t(n * K + k)]);
      const double bound = K * test::kF32Unit * abs_sum;
      const double v = y[size_t(m * N + n)];
      EXPECT_NEAR(y32[size_t(m * N + n)], v, bound) << m << "," << n;
      EXPECT_NEAR(y16[size_t(m * N + n)], v, bound + 0.5 * test::bf16_ulp(std::fabs(v) + bound)) << m << "," << n;
    }
}

}  // namespace
}  // namespace dsv41
