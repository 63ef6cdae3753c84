// src/train/grad/rms_norm.h: the backward against central differences (input and weight), and the
// forward against the CPU op (backend/cpu/norm.h) on the same inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/norm.h"
#include "gradcheck.h"
#include "train/grad/rms_norm.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

constexpr double kNormEps = 1e-20;  // V4.1 norm_eps

TEST(GradRmsNorm, GradientsMatchCentralDifferences) {
  const int64_t rows = 3, dim = 16;
  std::vector<double> x = normal_values(size_t(rows * dim), 1.0, 1);
  for (int64_t k = 0; k < dim; ++k) x[size_t(2 * dim + k)] *= 8;  // a row of another scale
  std::vector<double> w = normal_values(size_t(dim), 1.0, 2);
  const std::vector<double> c = normal_values(x.size(), 1.0, 3);
  std::vector<double> y(x.size());
  grad::RmsNormSaved<double> saved;
  auto loss = [&] {
    grad::rms_norm_forward(x.data(), rows, dim, w.data(), kNormEps, y.data(), saved);
    return weighted_sum(c, y);
  };
  loss();
  std::vector<double> dx(x.size(), 0.0), dw(w.size(), 0.0);
  grad::rms_norm_backward(x.data(), rows, dim, w.data(), saved, c.data(), dx.data(), dw.data());
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dw", w, dw, loss);
}

TEST(GradRmsNorm, UnweightedGradientMatchesCentralDifferences) {
  const int64_t rows = 2, dim = 8;
  std::vector<double> x = normal_values(size_t(rows * dim), 1.0, 4);
  const std::vector<double> c = normal_values(x.size(), 1.0, 5);
  std::vector<double> y(x.size());
  grad::RmsNormSaved<double> saved;
  auto loss = [&] {
    grad::rms_norm_forward<double>(x.data(), rows, dim, nullptr, kNormEps, y.data(), saved);
    return weighted_sum(c, y);
  };
  loss();
  std::vector<double> dx(x.size(), 0.0);
  grad::rms_norm_backward<double>(x.data(), rows, dim, nullptr, saved, c.data(), dx.data(), nullptr);
  expect_gradient("dx", x, dx, loss);
}

// The CPU op rounds y to bf16 after an fp32 evaluation; ours is the exact formula (in double).
// Before its rounding the CPU's y errs by at most δ = (dim/2 + 5) fp32 units of |y|: the sum of
// squares by dim units (any order), the mean, + eps, sqrt and the division by 4 more, halved
// through the square root, and the two products by one each. Rounding to bf16 adds half a bf16 ulp
// of the value it rounds, so |y_cpu − y| ≤ δ + ½ ulp_bf16(|y| + δ).
TEST(GradRmsNorm, ForwardMatchesTheCpuOp) {
  const int64_t rows = 4, dim = 256;
  const std::vector<float> xf = test::bf16_normal(size_t(rows * dim), 2.0, 6);
  const std::vector<float> wf = test::bf16_normal(size_t(dim), 1.0, 7);
  std::vector<float> y_cpu(xf.size());
  const Weight weight = test::f32_view(wf, 1, dim);
  rms_norm(xf.data(), rows, dim, &weight, float(kNormEps), y_cpu.data());
  const std::vector<double> x(xf.begin(), xf.end()), w(wf.begin(), wf.end());
  std::vector<double> y(x.size());
  grad::RmsNormSaved<double> saved;
  grad::rms_norm_forward(x.data(), rows, dim, w.data(), kNormEps, y.data(), saved);
  for (size_t i = 0; i < y.size(); ++i) {
    const double delta = (dim / 2 + 5) * test::kF32Unit * std::fabs(y[i]);
    EXPECT_NEAR(y_cpu[i], y[i], delta + 0.5 * test::bf16_ulp(std::fabs(y[i]) + delta)) << i;
  }
}

}  // namespace
}  // namespace dsv41
