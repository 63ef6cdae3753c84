// The Sinkhorn-balanced update on the device (train_cuda/optim/sinkhorn_update.h) against
// src/train/optim/sinkhorn_update.h: four steps from random weights, gradients whose rows spread
// over four decades, with zero rows (tokens the batch did not touch) and rows at 1e-7 of the
// others (masked: ρᵢ ≤ τ ρ̄), on the test model's tables (32 × 8, 40 × 8), tiny ones (1 × 1, 1 × 7,
// 7 × 1), 1000 × 64, 1500 × 37 (three chunks of 512 rows, the last partial), and a vocabulary-sized
// 129280 × 16 (253 chunks).
//
// Tolerances:
//  * The momentum: the same bits at every step (element by element, as the CPU's).
//  * The weights, per element. The scales D_r, D_c are doubles on both sides whose sums run in
//    other orders (the row sums in a tree, the column sums in 512-row chunks): they differ by a few
//    units of 2⁻⁵³ per sum, compounded over the 11 steps to well below 1e-12 relative. U rounds
//    the same double expression to float, so it is the CPU's float, or (where the exact value lies
//    within that 1e-12 of a rounding midpoint) one unit of 2⁻²³ |U| away. Then W − γη U is one
//    more rounding, which two differing inputs can send to neighbouring floats. So after t steps
//    |W_gpu − W_cpu| ≤ t · 2⁻²³ (max|W| + γη max|U|) per element, and the elements whose bits
//    differ at all are rare: the chance of a midpoint that close is about 1e-12 / 2⁻²⁴ ≈ 2e-5 per
//    element and step; bound 1e-3 of the elements after four steps. A wrong ε, column target,
//    mask or scale moves every element by a fraction of γη|U| ≈ 4e-3, past both bounds.
// An all-zero gradient from zero momentum leaves W exactly as it was (every row masked: U = 0).
// Two runs on the device give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "optim_device.h"
#include "train/cuda/optim/sinkhorn_update.h"
#include "train/optim/sinkhorn_update.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Shape {
  int64_t rows, cols;
};
constexpr Shape kShapes[] = {{32, 8}, {40, 8}, {1, 1}, {1, 7}, {7, 1}, {1000, 64}, {1500, 37}, {129280, 16}};
constexpr int kSteps = 4;
constexpr float kLr = 0.02f;

// Rows scaled by 10^U(-2, 2); every 7th row zero and every 11th at 1e-7 (from the second row on:
// a one-row table keeps its row).
std::vector<float> gradient(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  std::uniform_real_distribution<double> decade(-2, 2);
  std::vector<float> g(size_t(s.rows * s.cols));
  for (int64_t i = 0; i < s.rows; ++i) {
    double scale = std::pow(10.0, decade(rng));
    if (i > 0 && i % 7 == 0) scale = 0;
    if (i > 0 && i % 11 == 0) scale = 1e-7;
    for (int64_t j = 0; j < s.cols; ++j) g[size_t(i * s.cols + j)] = float(scale * normal(rng));
  }
  return g;
}

std::vector<float> on_device(const Shape& s, const std::vector<float>& W0, const std::vector<std::vector<float>>& grads,
              const std::vector<std::vector<float>>& cpu_momenta) {
  DeviceArray<float> W(W0), m(std::vector<float>(W0.size(), 0.0f)), g(W0.size());
  for (int t = 0; t < kSteps; ++t) {
    g.upload(grads[size_t(t)]);
    train_cuda::optim::sinkhorn_step(W.get(), g.get(), m.get(), s.rows, s.cols, kLr, optim::SinkhornOptions{});
    EXPECT_TRUE(test::same_bits(m.download(), cpu_momenta[size_t(t)])) << "momentum after step " << t;
  }
  return W.download();
}

TEST(CudaOptimSinkhorn, FourStepsMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  for (const Shape& s : kShapes) {
    const size_t n = size_t(s.rows * s.cols);
    const uint32_t seed = uint32_t(s.rows * 100 + s.cols);
    const std::vector<float> W0 = test::normal(n, 1.0, seed);
    std::vector<std::vector<float>> grads, momenta;
    std::vector<float> W = W0, m(n, 0.0f), before;
    double step_bound = 0;
    for (int t = 0; t < kSteps; ++t) {
      grads.push_back(gradient(s, seed + 1 + uint32_t(t)));
      before = W;
      optim::sinkhorn_step(W.data(), grads.back().data(), m.data(), s.rows, s.cols, kLr, optim::SinkhornOptions{});
      momenta.push_back(m);
      // 2⁻²³ (max|W| + γη max|U|) for this step, γη|U| read off the CPU's step (W's decay-free move).
      step_bound += 0x1p-23 * (test::max_abs(before) + test::max_abs_diff(W, before));
    }
    const std::string at = std::to_string(s.rows) + " × " + std::to_string(s.cols);
    SCOPED_TRACE(at);
    const std::vector<float> a = on_device(s, W0, grads, momenta);
    const double worst = test::max_abs_diff(a, W), differing = test::fraction_differing(a, W);
    std::printf("sinkhorn %s: max |dW| %.3g (bound %.3g), %.3g of the elements differ\n", at.c_str(), worst, step_bound,
                differing);
    EXPECT_LE(worst, step_bound);
    EXPECT_LE(differing, 1e-3);
    EXPECT_GT(test::max_abs_diff(W, W0), 100 * step_bound) << "the weights moved (the bound is not vacuous)";
    const std::vector<float> b = on_device(s, W0, grads, momenta);
    EXPECT_TRUE(test::same_bits(a, b)) << "two runs differ";
  }
}

TEST(CudaOptimSinkhorn, AZeroGradientLeavesTheWeights) {
  DSV41_REQUIRE_DEVICE();
  const int64_t rows = 50, cols = 9;
  const std::vector<float> W0 = test::normal(size_t(rows * cols), 1.0, 5), zero(W0.size(), 0.0f);
  DeviceArray<float> W(W0), m(zero), g(zero);
  train_cuda::optim::sinkhorn_step(W.get(), g.get(), m.get(), rows, cols, kLr, optim::SinkhornOptions{});
  EXPECT_TRUE(test::same_bits(W.download(), W0));
}

TEST(CudaOptimSinkhorn, RefusesAnEvenStepCount) {
  DSV41_REQUIRE_DEVICE();
  DeviceArray<float> x(12);
  optim::SinkhornOptions o;
  o.steps = 10;
  EXPECT_THROW(train_cuda::optim::sinkhorn_step(x.get(), x.get(), x.get(), 3, 4, 0.1f, o), Error);
}

}  // namespace
}  // namespace dsv41
