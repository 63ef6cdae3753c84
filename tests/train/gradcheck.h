#pragma once
// Finite-difference gradient checks for the backward ops of src/train/grad, in double precision.
//
// An op's outputs y are reduced to a scalar loss L = Σ_i c_i y_i with fixed random weights c (so
// the upstream gradient handed to the backward is c), and every coordinate x_i of an input or
// parameter is checked against the central difference
//
//   g_i ≈ (L(x + h e_i) − L(x − h e_i)) / 2h.
//
// Step and tolerance. The central difference errs by the truncation term h²/6 · |∂³L/∂x_i³| and by
// the rounding of the two losses, about 2 ε |L|_terms / 2h, where ε = 2⁻⁵³ and |L|_terms = Σ|c_i y_i|
// bounds how much rounding the loss carries. The tests use inputs of order one (the ops' natural
// scale: normed activations, logits of a few units), so with h = 1e-5 the truncation term is ~1e-11
// and the rounding term ~1e-11 · |L|_terms, far below the tolerance
//
//   |g_fd − g| ≤ 1e-6 · (|g| + max_j |g_j|)
//
// (measured over the suite: the worst coordinate uses 1.3% of it, at Engram's signed square root,
// whose third derivative grows as |dot|^-5/2 near the floor the test keeps its data from; most use
// under 0.1%), while a wrong term of a backward moves some g_i by a sizeable fraction of the
// gradient's scale (a 1% error in one term fails the checks). Each checked gradient must also be
// non-zero somewhere, so that no check passes by having nothing to compare.
//
// Where the op has kinks (a clamp, the signed square root's floor, top-k and expert choices), a
// test asserts that its data keeps every such point at least a few steps h away, so that no
// difference straddles one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace dsv41::test {

inline constexpr double kFdStep = 1e-5;
inline constexpr double kFdTolerance = 1e-6;

inline std::vector<double> normal_values(size_t n, double stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = normal(rng);
  return v;
}

inline std::vector<double> uniform_values(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = uniform(rng);
  return v;
}

// Σ_i c_i y_i: the loss every check reduces an op's outputs to.
inline double weighted_sum(const std::vector<double>& c, const std::vector<double>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += c[i] * y[i];
  return s;
}

// Checks `analytic` (dL/dx) against central differences of `loss` over every coordinate of x
// (`stride` > 1: every stride-th one, for large tensors). `loss` reads x; x is restored afterwards.
inline void expect_gradient(const std::string& what, std::vector<double>& x, const std::vector<double>& analytic,
                            const std::function<double()>& loss, size_t stride = 1) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  double scale = 0;
  for (double g : analytic) scale = std::max(scale, std::fabs(g));
  ASSERT_GT(scale, 1e-6) << what << ": the gradient is zero, the check would compare nothing";
  int failures = 0;
  for (size_t i = 0; i < x.size(); i += stride) {
    const double saved = x[i];
    x[i] = saved + kFdStep;
    const double up = loss();
    x[i] = saved - kFdStep;
    const double down = loss();
    x[i] = saved;
    const double fd = (up - down) / (2 * kFdStep);
    const double tol = kFdTolerance * (std::fabs(analytic[i]) + scale);
    if (std::fabs(fd - analytic[i]) > tol && ++failures <= 5)
      ADD_FAILURE() << what << "[" << i << "]: backward " << analytic[i] << ", central difference " << fd
                    << " (tolerance " << tol << ")";
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " coordinates off";
}

}  // namespace dsv41::test
