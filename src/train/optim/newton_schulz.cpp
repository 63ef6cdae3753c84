#include "train/optim/newton_schulz.h"

#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"

namespace dsv41::optim {

void orthogonalize(const float* U, int64_t rows, int64_t cols, float* out) {
  const bool tall = rows > cols;
  const int64_t r = tall ? cols : rows, c = tall ? rows : cols;  // X is [r, c], r ≤ c
  double sum_sq = 0;
  for (int64_t i = 0; i < rows * cols; ++i) sum_sq += double(U[i]) * U[i];
  const float inv_norm = float(1.0 / (std::sqrt(sum_sq) + kNewtonSchulzEps));

  std::vector<float> X(size_t(r * c)), Xt(size_t(c * r)), A(size_t(r * r)), A2(size_t(r * r)), Y(size_t(r * c));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) X[size_t(i * c + j)] = (tall ? U[j * cols + i] : U[i * cols + j]) * inv_norm;

  for (const NewtonSchulzStage& s : kHybridNewtonSchulz)
    for (int it = 0; it < s.iterations; ++it) {
      gemm_f32(X.data(), r, X.data(), r, c, A.data(), r);  // A = X Xᵀ (bitwise symmetric)
      gemm_f32(A.data(), r, A.data(), r, r, A2.data(), r);  // A Aᵀ = A²
      for (size_t k = 0; k < A.size(); ++k) A[k] = s.b * A[k] + s.c * A2[k];
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) Xt[size_t(j * r + i)] = X[size_t(i * c + j)];
      gemm_f32(A.data(), r, Xt.data(), c, r, Y.data(), c);  // (b A + c A²) X
      for (size_t k = 0; k < X.size(); ++k) X[k] = s.a * X[k] + Y[k];
    }

  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) (tall ? out[j * cols + i] : out[i * cols + j]) = X[size_t(i * c + j)];
}

}  // namespace dsv41::optim
