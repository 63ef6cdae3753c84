#include "train/optim/sinkhorn_update.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/optim/nesterov.h"

namespace dsv41::optim {

void sinkhorn_balance(const float* G, int64_t rows, int64_t cols, const SinkhornOptions& o, float* U) {
  if (o.steps < 1 || o.steps % 2 == 0)
    fail("sinkhorn_balance", "an odd number of steps (the last one normalizes the rows)", std::to_string(o.steps));
  if (rows < 1 || cols < 1)
    fail("sinkhorn_balance", "a matrix of at least 1 × 1", std::to_string(rows) + " × " + std::to_string(cols));
  // The scales in double: they are m + n numbers, and the sums of squares run over a whole row or
  // column of a table that may have millions of rows.
  std::vector<double> r(static_cast<size_t>(rows)), c(static_cast<size_t>(cols), 1.0), rho(static_cast<size_t>(rows));
  auto row_norm = [&](int64_t i) {
    double s = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double x = r[size_t(i)] * G[i * cols + j] * c[size_t(j)];
      s += x * x;
    }
    return std::sqrt(s);
  };

  double mean = 0;
  for (int64_t i = 0; i < rows; ++i) {
    r[size_t(i)] = 1;
    rho[size_t(i)] = row_norm(i);
    mean += rho[size_t(i)];
  }
  mean /= double(rows);
  int64_t unmasked = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const bool kept = rho[size_t(i)] > double(o.tau) * mean;
    r[size_t(i)] = kept ? 1 / (rho[size_t(i)] + o.eps) : 0;  // step 1: the first row normalization
    unmasked += kept;
  }
  if (unmasked == 0) {
    for (int64_t k = 0; k < rows * cols; ++k) U[k] = 0;
    return;
  }

  const double column_target = std::sqrt(double(unmasked) / double(cols));
  std::vector<double> col_sq(static_cast<size_t>(cols));
  for (int step = 2; step <= o.steps; ++step) {
    if (step % 2 == 0) {
      std::fill(col_sq.begin(), col_sq.end(), 0.0);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) {
          const double x = r[size_t(i)] * G[i * cols + j] * c[size_t(j)];
          col_sq[size_t(j)] += x * x;
        }
      for (int64_t j = 0; j < cols; ++j) c[size_t(j)] *= column_target / (std::sqrt(col_sq[size_t(j)]) + o.eps);
    } else {
      for (int64_t i = 0; i < rows; ++i) r[size_t(i)] /= row_norm(i) + o.eps;
    }
  }

  const double alpha = std::sqrt(double(cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) U[i * cols + j] = float(alpha * r[size_t(i)] * G[i * cols + j] * c[size_t(j)]);
}

void sinkhorn_step(float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, float lr,
                   const SinkhornOptions& o) {
  const int64_t n = rows * cols;
  std::vector<float> lookahead(static_cast<size_t>(n)), update(static_cast<size_t>(n));
  nesterov_momentum(grad, momentum, n, o.momentum, lookahead.data());
  sinkhorn_balance(lookahead.data(), rows, cols, o, update.data());
  const float step = o.lr_correction * lr;
  for (int64_t i = 0; i < n; ++i) W[i] -= step * update[size_t(i)];
}

}  // namespace dsv41::optim
