#pragma once
// Helpers of the optimizer tests: seeded random matrices, singular values computed in double by a
// method independent of the code under test (the cyclic Jacobi eigenvalue iteration on the
// smaller Gram matrix), and a temporary file. (tests/test_util.h's TempDir needs the dsv41
// binary's definitions, which this core-only binary does not have.)
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace dsv41::optim::test {

inline std::vector<float> gaussian(size_t n, double stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = float(normal(rng));
  return v;
}

// The hybrid Newton–Schulz iteration on one singular value, with the report's (V4 Algorithm 1's)
// coefficients written out here, apart from the library's table: 8 × (3.4445, −4.7750, 2.0315),
// then 2 × (2, −1.5, 0.5).
inline double hybrid_newton_schulz_map(double sigma) {
  auto quintic = [](double x, double a, double b, double c) { return a * x + b * x * x * x + c * x * x * x * x * x; };
  for (int i = 0; i < 8; ++i) sigma = quintic(sigma, 3.4445, -4.7750, 2.0315);
  for (int i = 0; i < 2; ++i) sigma = quintic(sigma, 2, -1.5, 0.5);
  return sigma;
}

inline double rms(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * x[i];
  return std::sqrt(s / double(n));
}

// Eigenvalues of the symmetric a [n, n] (destroyed), ascending: Jacobi rotations until every
// off-diagonal entry is below 1e-15 of the matrix's norm (quadratic convergence: a few sweeps).
inline std::vector<double> symmetric_eigenvalues(std::vector<double> a, int64_t n) {
  auto at = [&](int64_t i, int64_t j) -> double& { return a[size_t(i * n + j)]; };
  double norm = 0;
  for (double x : a) norm += x * x;
  norm = std::sqrt(norm);
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = i + 1; j < n; ++j) off = std::max(off, std::abs(at(i, j)));
    if (off <= 1e-15 * norm) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (at(p, q) == 0) continue;
        const double theta = (at(q, q) - at(p, p)) / (2 * at(p, q));
        const double t = (theta >= 0 ? 1 : -1) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int64_t k = 0; k < n; ++k) {  // A ← A J (columns p, q)
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = c * akp - s * akq;
          at(k, q) = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // A ← Jᵀ A (rows p, q)
          const double apk = at(p, k), aqk = at(q, k);
          at(p, k) = c * apk - s * aqk;
          at(q, k) = s * apk + c * aqk;
        }
      }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ev[size_t(i)] = at(i, i);
  std::sort(ev.begin(), ev.end());
  return ev;
}

// The min(rows, cols) singular values of x [rows, cols], ascending.
inline std::vector<double> singular_values(const float* x, int64_t rows, int64_t cols) {
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;
  auto get = [&](int64_t i, int64_t k) { return double(tall ? x[k * cols + i] : x[i * cols + k]); };
  std::vector<double> gram(static_cast<size_t>(r * r));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < r; ++j) {
      double s = 0;
      for (int64_t k = 0; k < c; ++k) s += get(i, k) * get(j, k);
      gram[size_t(i * r + j)] = s;
    }
  std::vector<double> sv = symmetric_eigenvalues(std::move(gram), r);
  for (double& v : sv) v = std::sqrt(std::max(v, 0.0));
  return sv;
}

// A path under the system's temp directory, unique per process and instance, removed at the end.
class TempFile {
 public:
  explicit TempFile(const std::string& tag) {
    static int counter = 0;
    path_ = (std::filesystem::temp_directory_path() /
             ("dsv41_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
                .string();
  }
  ~TempFile() { std::filesystem::remove(path_); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dsv41::optim::test
