// Muon (muon.h): the update's RMS, head-wise blocks, Nesterov momentum and decoupled weight decay
// against answers derived by hand, and a least-squares problem it solves monotonically.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "train/optim/muon.h"
#include "optim_test_util.h"

namespace dsv41::optim {
namespace {

// The update of one step from zero momentum at lr 1 without decay: −O, O = orthogonalize(Ĝ) ·
// √max · γ.
std::vector<float> first_update(const std::vector<float>& G, int64_t rows, int64_t cols, int64_t blocks) {
  std::vector<float> W(G.size(), 0.0f), momentum(G.size(), 0.0f);
  MuonOptions o;
  o.weight_decay = 0;
  muon_step(W.data(), G.data(), momentum.data(), rows, cols, blocks, 1.0f, o);
  for (float& x : W) x = -x;
  return W;
}

// RMS of an update of full rank: γ √(mean σ²) with every σ in the Newton–Schulz band [1, 1.00054]
// (newton_schulz_test: singular values of Gaussian matrices this shape are ≥ 1e-3 of the norm),
// widened by that test's 2e-5 for fp32.
constexpr double kRmsLow = 0.18 * (1 - 2e-5), kRmsHigh = 0.18 * (1.00054 + 2e-5);

TEST(Muon, UpdateRmsIsGammaForWideAndTallMatrices) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{32, 64}, {96, 40}}) {
    const std::vector<float> G = test::gaussian(size_t(rows * cols), 0.01, uint32_t(rows));
    const std::vector<float> O = first_update(G, rows, cols, 1);
    const double r = test::rms(O.data(), O.size());
    EXPECT_GE(r, kRmsLow) << rows << " x " << cols;
    EXPECT_LE(r, kRmsHigh) << rows << " x " << cols;
  }
}

// Head-wise: each head's block [8, 48] is orthogonalised alone, so its rows are orthonormal
// (after the scale √48 · γ) and its RMS is γ; rows of different heads are not orthogonal, as
// they are when the [32, 48] matrix is one block.
TEST(Muon, HeadWiseBlocksAreOrthogonalisedSeparately) {
  const int64_t heads = 4, head_rows = 8, cols = 48, rows = heads * head_rows;
  const std::vector<float> G = test::gaussian(size_t(rows * cols), 1.0, 3);
  const std::vector<float> headwise = first_update(G, rows, cols, heads);
  const std::vector<float> whole = first_update(G, rows, cols, 1);
  auto row_dot = [&](const std::vector<float>& O, int64_t i, int64_t j, double scale) {
    double d = 0;
    for (int64_t k = 0; k < cols; ++k) d += double(O[size_t(i * cols + k)]) * O[size_t(j * cols + k)];
    return d / (scale * scale);
  };
  const double block_scale = std::sqrt(48.0) * 0.18, whole_scale = std::sqrt(48.0) * 0.18;
  double largest_cross_headwise = 0, largest_cross_whole = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < rows; ++j) {
      const bool same_head = i / head_rows == j / head_rows;
      const double dh = row_dot(headwise, i, j, block_scale), dw = row_dot(whole, i, j, whole_scale);
      // σ² ∈ [1, 1.00054²] on the diagonal of O Oᵀ / scale²; the off-diagonal entries are within
      // the band's width of 0 (plus fp32 rounding).
      if (same_head) EXPECT_NEAR(dh, i == j ? 1.0 : 0.0, 1.2e-3) << i << ", " << j;
      else largest_cross_headwise = std::max(largest_cross_headwise, std::abs(dh));
      if (i != j) largest_cross_whole = std::max(largest_cross_whole, std::abs(dw));
    }
  EXPECT_GT(largest_cross_headwise, 0.1);  // independent heads' rows: far from orthogonal
  EXPECT_LT(largest_cross_whole, 1.2e-3);
  for (int64_t h = 0; h < heads; ++h) {
    const double r = test::rms(headwise.data() + h * head_rows * cols, size_t(head_rows * cols));
    EXPECT_GE(r, kRmsLow);
    EXPECT_LE(r, kRmsHigh);
  }
}

// Two steps on rank-one gradients that share their left vector and turn the right one:
// G₁ = a u vᵀ, G₂ = b u wᵀ (u, v, w unit, v ⊥ w), lr η, decay λ, from W₀. By hand (nesterov.h, in
// V4's sum form M ← μM + G, Ĝ = μM + G; the lerp form is (1 − μ) times it, which the
// normalization removes):
//   step 1: Ĝ = (1 + μ) G₁, one singular value, normalized to 1 → O₁ = p(1) u vᵀ · s
//   step 2: M = μG₁ + G₂, Ĝ = μ²G₁ + (1 + μ)G₂ = u zᵀ with z = μ²a v + (1 + μ)b w: rank one
//           again → O₂ = p(1) u ẑᵀ · s, ẑ = z / ‖z‖
//   W₂ = (W₀(1 − ηλ) − η O₁)(1 − ηλ) − η O₂,  s = √max(rows, cols) · γ
// with p the hybrid Newton–Schulz map on one singular value. Newton–Schulz erases singular
// values, not directions: the direction ẑ is where Nesterov's μ² : (1 + μ) mix shows (plain
// momentum's μ : 1 would turn it by 0.13 rad, moving entries by ~5e-3).
TEST(Muon, NesterovMomentumAndDecayMatchTheHandComputedSteps) {
  const int64_t rows = 4, cols = 6;
  const double mu = 0.95, lr = 0.1, wd = 0.1, gamma = 0.18, a = 1.0, b = 0.3;
  const double h = 1 / std::sqrt(2.0);
  const double u[rows] = {h, h, 0, 0};
  const double v[cols] = {0, 0.6, 0.8, 0, 0, 0}, w[cols] = {0, 0.8, -0.6, 0, 0, 0};
  std::vector<float> G1(rows * cols), G2(rows * cols);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      G1[size_t(i * cols + j)] = float(a * u[i] * v[j]);
      G2[size_t(i * cols + j)] = float(b * u[i] * w[j]);
    }
  std::vector<float> W = test::gaussian(size_t(rows * cols), 1.0, 9), momentum(W.size(), 0.0f);
  const std::vector<float> W0 = W;
  MuonOptions o;  // the report's μ, λ, γ
  muon_step(W.data(), G1.data(), momentum.data(), rows, cols, 1, float(lr), o);
  muon_step(W.data(), G2.data(), momentum.data(), rows, cols, 1, float(lr), o);

  const double p1 = test::hybrid_newton_schulz_map(1.0);
  const double s = std::sqrt(6.0) * gamma, decay = 1 - lr * wd;
  const double zv = mu * mu * a, zw = (1 + mu) * b, zn = std::sqrt(zv * zv + zw * zw);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double o1 = p1 * u[i] * v[j] * s;
      const double o2 = p1 * u[i] * (zv * v[j] + zw * w[j]) / zn * s;
      const double want = (W0[size_t(i * cols + j)] * decay - lr * o1) * decay - lr * o2;
      // Entries of order 1 after a few fp32 operations, and NS's 2e-5 per singular value times
      // η s ≈ 0.04: 1e-5 is an ample bound (measured: 1.7e-7).
      EXPECT_NEAR(W[size_t(i * cols + j)], want, 1e-5) << i << ", " << j;
    }
}

TEST(Muon, ZeroGradientOnlyDecays) {
  std::vector<float> W = test::gaussian(12, 1.0, 4), momentum(12, 0.0f), zero(12, 0.0f);
  const std::vector<float> W0 = W;
  MuonOptions o;
  muon_step(W.data(), zero.data(), momentum.data(), 3, 4, 1, 0.5f, o);
  for (size_t i = 0; i < W.size(); ++i) EXPECT_EQ(W[i], W0[i] * (1 - 0.5f * o.weight_decay));
}

TEST(Muon, RefusesBlocksThatDoNotDivideTheRows) {
  std::vector<float> W(12), G(12), m(12);
  EXPECT_THROW(muon_step(W.data(), G.data(), m.data(), 6, 2, 4, 0.1f, MuonOptions{}), Error);
}

// Least squares: L(W) = ½ ‖W X − Y‖² / N with Y = W* X, X [16, 64] Gaussian (well conditioned:
// its singular values within a factor 3 of each other), W₀ = 0, 60 steps at lr 0.04 (steps of RMS
// 0.0072 against a distance of RMS 1, so no step can overshoot). Each step lowers the loss, both
// as one block and head-wise (2 blocks), and 60 steps more than halve it.
TEST(Muon, LeastSquaresLossFallsEveryStep) {
  const int64_t out = 8, in = 16, n = 64;
  const std::vector<float> X = test::gaussian(size_t(in * n), 1.0, 21), Wstar = test::gaussian(size_t(out * in), 1.0, 22);
  auto residual = [&](const std::vector<float>& W, std::vector<double>& R) {
    double loss = 0;
    for (int64_t i = 0; i < out; ++i)
      for (int64_t t = 0; t < n; ++t) {
        double r = 0;
        for (int64_t k = 0; k < in; ++k) r += double(W[size_t(i * in + k)] - Wstar[size_t(i * in + k)]) * X[size_t(k * n + t)];
        R[size_t(i * n + t)] = r;
        loss += 0.5 * r * r / double(n);
      }
    return loss;
  };
  for (int64_t blocks : {1, 2}) {
    std::vector<float> W(size_t(out * in), 0.0f), momentum(W.size(), 0.0f), G(W.size());
    std::vector<double> R(size_t(out * n));
    double loss = residual(W, R);
    const double first = loss;
    for (int step = 0; step < 60; ++step) {
      for (int64_t i = 0; i < out; ++i)
        for (int64_t k = 0; k < in; ++k) {
          double g = 0;
          for (int64_t t = 0; t < n; ++t) g += R[size_t(i * n + t)] * X[size_t(k * n + t)];
          G[size_t(i * in + k)] = float(g / double(n));
        }
      muon_step(W.data(), G.data(), momentum.data(), out, in, blocks, 0.04f, MuonOptions{});
      const double next = residual(W, R);
      ASSERT_LT(next, loss) << "step " << step << ", " << blocks << " block(s)";
      loss = next;
    }
    EXPECT_LT(loss, 0.5 * first) << blocks << " block(s)";
  }
}

}  // namespace
}  // namespace dsv41::optim
