// The Sinkhorn-balanced update (sinkhorn_update.h): the balanced matrix's known form on a rank-one
// input, its rows and columns at RMS 1, the mask of near-zero rows, scale invariance, and an
// embedding-table problem it solves monotonically.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"
#include "train/optim/sinkhorn_update.h"
#include "optim_test_util.h"

namespace dsv41::optim {
namespace {

double row_rms(const std::vector<float>& U, int64_t cols, int64_t i) { return test::rms(U.data() + i * cols, size_t(cols)); }

double col_rms(const std::vector<float>& U, int64_t rows, int64_t cols, int64_t j, int64_t counted_rows) {
  double s = 0;
  for (int64_t i = 0; i < rows; ++i) s += double(U[size_t(i * cols + j)]) * U[size_t(i * cols + j)];
  return std::sqrt(s / double(counted_rows));
}

// G = u vᵀ: after the first row step every row is ±v/‖v‖, so every column has one magnitude
// |vⱼ|/‖v‖ and the first column step makes all entries ±1/√n; the rest leaves them, and √n gives
// Uᵢⱼ = sign(uᵢ) sign(vⱼ) exactly, whatever the magnitudes (u's spread, 75, keeps every row
// above the mask's τ ρ̄). Tolerance: a few fp32/double roundings of numbers of order 1: 1e-6.
TEST(SinkhornUpdate, RankOneBalancesToItsSignPattern) {
  const int64_t m = 7, n = 5;
  const double u[m] = {3, -0.2, 15, 1, -7, 0.5, 4}, v[n] = {0.001, -2, 0.3, 9, -0.05};
  std::vector<float> G(m * n), U(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) G[size_t(i * n + j)] = float(u[i] * v[j]);
  sinkhorn_balance(G.data(), m, n, SinkhornOptions{}, U.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      EXPECT_NEAR(U[size_t(i * n + j)], (u[i] > 0) == (v[j] > 0) ? 1.0 : -1.0, 1e-6) << i << ", " << j;
}

// A Gaussian [256, 16] matrix with rows and columns scaled over four decades each. After the
// update every row has RMS 1 (the last step normalizes rows: to rounding, 1e-6) and every column
// RMS 1 up to what K = 11 leaves of Sinkhorn's convergence: measured within 1.0e-4 on this
// matrix (the iteration sets it, not the rounding, which adds ~1e-7), bound 1e-3. The input's
// columns spread over a factor of 1e4 in RMS.
TEST(SinkhornUpdate, RowsAndColumnsEndAtRmsOne) {
  const int64_t m = 256, n = 16;
  std::vector<float> G = test::gaussian(size_t(m * n), 1.0, 41), U(G.size());
  const std::vector<float> row_log = test::gaussian(size_t(m), 1.0, 42);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      G[size_t(i * n + j)] *= float(std::pow(10.0, 0.5 * row_log[size_t(i)]) * std::pow(10.0, 4.0 * double(j) / (n - 1) - 2));
  sinkhorn_balance(G.data(), m, n, SinkhornOptions{}, U.data());
  for (int64_t i = 0; i < m; ++i) ASSERT_NEAR(row_rms(U, n, i), 1.0, 1e-6) << "row " << i;
  for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(col_rms(U, m, n, j, m), 1.0, 1e-3) << "column " << j;
}

// Rows with ρᵢ ≤ τ ρ̄ get no update; a row just above the threshold is balanced like the others.
// Ten rows of norm 1, a zero row, a row of norm 1e-4 and one of 2e-3: ρ̄ = 10.0021 / 13 ≈ 0.769,
// τ ρ̄ ≈ 7.7e-4, so the zero row and the 1e-4 row are masked and the 2e-3 row is not.
TEST(SinkhornUpdate, MasksRowsAtOrBelowTauTimesTheMeanNorm) {
  const int64_t m = 13, n = 4;
  std::vector<float> G(m * n, 0.0f), U(G.size());
  const std::vector<float> noise = test::gaussian(size_t(m * n), 1.0, 43);
  for (int64_t i = 0; i < m; ++i) {
    const double norm = i < 10 ? 1.0 : i == 10 ? 0.0 : i == 11 ? 1e-4 : 2e-3;
    double s = 0;
    for (int64_t j = 0; j < n; ++j) s += double(noise[size_t(i * n + j)]) * noise[size_t(i * n + j)];
    for (int64_t j = 0; j < n; ++j) G[size_t(i * n + j)] = float(noise[size_t(i * n + j)] * norm / std::sqrt(s));
  }
  sinkhorn_balance(G.data(), m, n, SinkhornOptions{}, U.data());
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_EQ(U[size_t(10 * n + j)], 0.0f);
    EXPECT_EQ(U[size_t(11 * n + j)], 0.0f);
  }
  EXPECT_NEAR(row_rms(U, n, 12), 1.0, 1e-6);
  // The columns are balanced over the 11 unmasked rows (m′ = 11); K = 11 leaves this small matrix
  // within 3.9e-3 of balance (measured; the iteration's, not rounding's), bound 0.02.
  for (int64_t j = 0; j < n; ++j) EXPECT_NEAR(col_rms(U, m, n, j, 11), 1.0, 0.02) << "column " << j;
}

TEST(SinkhornUpdate, IgnoresTheScaleAndFollowsTheSign) {
  const int64_t m = 20, n = 6;
  const std::vector<float> G = test::gaussian(size_t(m * n), 1.0, 44);
  std::vector<float> big(G.size()), neg(G.size()), U(G.size()), Ub(G.size()), Un(G.size());
  for (size_t k = 0; k < G.size(); ++k) {
    big[k] = G[k] * 1024.0f;  // a power of two: the same matrix up to its exponent
    neg[k] = -G[k];
  }
  sinkhorn_balance(G.data(), m, n, SinkhornOptions{}, U.data());
  sinkhorn_balance(big.data(), m, n, SinkhornOptions{}, Ub.data());
  sinkhorn_balance(neg.data(), m, n, SinkhornOptions{}, Un.data());
  for (size_t k = 0; k < G.size(); ++k) {
    EXPECT_NEAR(Ub[k], U[k], 1e-6);
    EXPECT_EQ(Un[k], -U[k]);
  }
}

TEST(SinkhornUpdate, ZeroGradientLeavesTheTable) {
  std::vector<float> W = test::gaussian(24, 1.0, 45), momentum(24, 0.0f), zero(24, 0.0f);
  const std::vector<float> W0 = W;
  sinkhorn_step(W.data(), zero.data(), momentum.data(), 6, 4, 0.1f, SinkhornOptions{});
  EXPECT_EQ(W, W0);  // no weight decay, and an all-masked update
}

TEST(SinkhornUpdate, RefusesAnEvenNumberOfSteps) {
  std::vector<float> G(6, 1.0f), U(6);
  SinkhornOptions o;
  o.steps = 10;
  EXPECT_THROW(sinkhorn_balance(G.data(), 2, 3, o, U.data()), Error);
}

// An embedding table W [64, 8] fit to targets W* (L = ½ ‖W − W*‖²) from batches: each step's
// gradient has only the rows of 16 random ids (a row gathered twice collects twice), as an
// embedding's does. Steps of RMS γη = 0.009 against a distance of RMS 1; the momentum of rows
// outside the batch keeps moving them towards their targets. Every step lowers the loss.
TEST(SinkhornUpdate, EmbeddingLossFallsEveryStep) {
  const int64_t m = 64, n = 8;
  const std::vector<float> target = test::gaussian(size_t(m * n), 1.0, 46);
  std::vector<float> W(size_t(m * n), 0.0f), momentum(W.size(), 0.0f), grad(W.size());
  auto loss = [&] {
    double l = 0;
    for (size_t k = 0; k < W.size(); ++k) l += 0.5 * double(W[k] - target[k]) * (W[k] - target[k]);
    return l;
  };
  std::mt19937 rng(47);
  std::uniform_int_distribution<int64_t> id(0, m - 1);
  double current = loss();
  const double first = current;
  for (int step = 0; step < 60; ++step) {
    std::fill(grad.begin(), grad.end(), 0.0f);
    for (int t = 0; t < 16; ++t) {
      const int64_t i = id(rng);
      for (int64_t j = 0; j < n; ++j) grad[size_t(i * n + j)] += W[size_t(i * n + j)] - target[size_t(i * n + j)];
    }
    sinkhorn_step(W.data(), grad.data(), momentum.data(), m, n, 0.05f, SinkhornOptions{});
    const double next = loss();
    ASSERT_LT(next, current) << "step " << step;
    current = next;
  }
  EXPECT_LT(current, 0.8 * first);
}

}  // namespace
}  // namespace dsv41::optim
