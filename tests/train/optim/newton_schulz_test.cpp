// The hybrid Newton–Schulz iteration (newton_schulz.h) maps each singular value σ of U/‖U‖_F
// through the composition p of its ten quintics and keeps the singular vectors. The expectations
// come from p evaluated on scalars, in double, with the report's coefficients written out again
// (optim_test_util.h, not the library's table), and from singular values computed in double by
// Jacobi.
//
// Tolerance: the products run in fp32 (gemm_f32, sums of at most 64 terms: relative error below
// 64 · 2⁻²⁴ ≈ 4e-6 per product in the worst case); the last two quintics have p′(1) = 0, so an
// error δ in a singular value near 1 leaves them as δ²/2, and what is left is the last step's own
// rounding. 2e-5 on a singular value is five times the worst-case error of one step; measured:
// at most 5.6e-8 on these matrices (the Gaussian one's outputs span [1.000000, 1.000538]).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "train/optim/newton_schulz.h"
#include "optim_test_util.h"

namespace dsv41::optim {
namespace {

constexpr double kTolerance = 2e-5;

constexpr auto hybrid_map = test::hybrid_newton_schulz_map;

// Checks out = orthogonalize(U) singular value by singular value against p; returns the largest
// deviation. Singular values below `unresolved` of the norm are left out of the comparison: there
// p is steep (slope ≈ 3.4445⁸ ≈ 2e4 at 0) and fp32's rounding of X₀ and of the first products,
// ~1e-7 of the largest singular value, is a large relative error; the caller checks them apart.
double check_against_map(const std::vector<float>& U, int64_t rows, int64_t cols, double unresolved = 0) {
  std::vector<float> out(U.size());
  orthogonalize(U.data(), rows, cols, out.data());
  std::vector<double> in = test::singular_values(U.data(), rows, cols);
  double frob = 0;
  for (double s : in) frob += s * s;
  frob = std::sqrt(frob);
  std::vector<double> expected;
  size_t skipped = 0;
  for (double s : in) {
    if (s / frob < unresolved) ++skipped;
    else expected.push_back(hybrid_map(s / frob));
  }
  // p is not monotonic: match the sorted lists. The left-out values end below 0.9 (p < 0.9 on
  // [0, 2.5e-5]), the others at 1 or above, so they are the smallest outputs.
  std::sort(expected.begin(), expected.end());
  std::vector<double> got = test::singular_values(out.data(), rows, cols);
  for (size_t i = 0; i < skipped; ++i) EXPECT_LT(got[i], 0.9) << "an unresolved singular value reached 1";
  got.erase(got.begin(), got.begin() + std::ptrdiff_t(skipped));
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], kTolerance) << "singular value " << i;
    worst = std::max(worst, std::abs(got[i] - expected[i]));
  }
  return worst;
}

TEST(NewtonSchulz, RandomMatrixSingularValuesEndInTheHybridBand) {
  // A 32 × 64 Gaussian matrix: its singular values over ‖U‖_F lie in about [0.05, 0.30]
  // (Marchenko–Pastur), inside [1e-3, 1], where p maps into [1, 1.00054].
  const int64_t rows = 32, cols = 64;
  const std::vector<float> U = test::gaussian(size_t(rows * cols), 1.0, 7);
  const std::vector<double> in = test::singular_values(U.data(), rows, cols);
  double frob = 0;
  for (double s : in) frob += s * s;
  ASSERT_GT(in.front() / std::sqrt(frob), 1e-3);

  std::vector<float> out(U.size());
  orthogonalize(U.data(), rows, cols, out.data());
  const std::vector<double> sv = test::singular_values(out.data(), rows, cols);
  EXPECT_GE(sv.front(), 1 - kTolerance);
  EXPECT_LE(sv.back(), 1.00054 + kTolerance);
  char worst[32];
  std::snprintf(worst, sizeof worst, "%.3g", check_against_map(U, rows, cols));
  RecordProperty("worst_deviation_from_map", worst);
  RecordProperty("singular_values", std::to_string(sv.front()) + " .. " + std::to_string(sv.back()));
}

TEST(NewtonSchulz, TallMatrixIsTheSameMapOfItsTranspose) {
  const int64_t rows = 64, cols = 24;
  const std::vector<float> U = test::gaussian(size_t(rows * cols), 3.0, 11);
  check_against_map(U, rows, cols);
  std::vector<float> Ut(U.size()), out(U.size()), out_t(U.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) Ut[size_t(j * rows + i)] = U[size_t(i * cols + j)];
  orthogonalize(U.data(), rows, cols, out.data());
  orthogonalize(Ut.data(), cols, rows, out_t.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) ASSERT_EQ(out[size_t(i * cols + j)], out_t[size_t(j * rows + i)]);
}

// Singular values chosen across five decades (U = P diag(σ) Qᵀ with random orthonormal P, Q):
// those ≥ 1e-4 of the norm end in [1, 1.0021]; 1e-5 is too small for ten iterations (p(1e-5) ≈
// 0.69), as the band in newton_schulz.h says.
TEST(NewtonSchulz, SmallSingularValuesFollowTheMapBelowTheBand) {
  const int64_t n = 12, m = 20;
  const double sigma[n] = {1, 0.8, 0.5, 0.3, 0.1, 0.03, 1e-2, 3e-3, 1e-3, 3e-4, 1e-4, 1e-5};
  auto orthonormal_rows = [](int64_t k, int64_t len, uint32_t seed) {
    std::vector<float> g = test::gaussian(size_t(k * len), 1.0, seed);
    std::vector<double> q(g.begin(), g.end());
    for (int64_t i = 0; i < k; ++i) {  // Gram–Schmidt twice, in double
      for (int pass = 0; pass < 2; ++pass)
        for (int64_t j = 0; j < i; ++j) {
          double d = 0;
          for (int64_t t = 0; t < len; ++t) d += q[size_t(i * len + t)] * q[size_t(j * len + t)];
          for (int64_t t = 0; t < len; ++t) q[size_t(i * len + t)] -= d * q[size_t(j * len + t)];
        }
      double norm = 0;
      for (int64_t t = 0; t < len; ++t) norm += q[size_t(i * len + t)] * q[size_t(i * len + t)];
      for (int64_t t = 0; t < len; ++t) q[size_t(i * len + t)] /= std::sqrt(norm);
    }
    return q;
  };
  const std::vector<double> P = orthonormal_rows(n, n, 3), Q = orthonormal_rows(n, m, 5);
  std::vector<float> U(size_t(n * m));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      double s = 0;
      for (int64_t k = 0; k < n; ++k) s += P[size_t(k * n + i)] * sigma[k] * Q[size_t(k * m + j)];
      U[size_t(i * m + j)] = float(s);
    }
  EXPECT_LT(hybrid_map(1e-5), 0.7);
  for (double s : {1e-4, 3e-4, 1e-3, 0.5, 1.0}) {
    EXPECT_GE(hybrid_map(s), 1.0);
    EXPECT_LE(hybrid_map(s), 1.0021);
  }
  check_against_map(U, n, m, 2.5e-5);
}

TEST(NewtonSchulz, ZeroStaysZero) {
  std::vector<float> U(6 * 9, 0.0f), out(U.size(), 1.0f);
  orthogonalize(U.data(), 6, 9, out.data());
  for (float x : out) EXPECT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace dsv41::optim
