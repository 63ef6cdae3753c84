#pragma once
// RMSNorm (model.py RMSNorm): y = w ⊙ x · r, r = (mean(x²) + eps)^-½ per row, without the
// reference's bf16 rounding of y (docs/training.md, "Precision flow").
//
//   dw += Σ_rows dy ⊙ x · r
//   dx += r · (w ⊙ dy) − x · r³ / n · Σ_k (w ⊙ dy)_k x_k
#include <cmath>
#include <cstdint>
#include <vector>

namespace dsv41::grad {

template <class T>
struct RmsNormSaved {
  std::vector<T> r;  // [rows] the inverse RMS
};

// x, y [rows, dim]; w [dim] or nullptr (unweighted). y may be x.
template <class T>
void rms_norm_forward(const T* x, int64_t rows, int64_t dim, const T* w, T eps, T* y, RmsNormSaved<T>& saved) {
  saved.r.resize(size_t(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * dim;
    T sum = 0;
    for (int64_t k = 0; k < dim; ++k) sum += xr[k] * xr[k];
    const T r = T(1) / std::sqrt(sum / T(dim) + eps);
    saved.r[size_t(i)] = r;
    for (int64_t k = 0; k < dim; ++k) y[i * dim + k] = (w ? w[k] : T(1)) * (xr[k] * r);
  }
}

// x is the forward's input (not its output); dw may be nullptr when w is.
template <class T>
void rms_norm_backward(const T* x, int64_t rows, int64_t dim, const T* w, const RmsNormSaved<T>& saved, const T* dy,
                       T* dx, T* dw) {
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * dim;
    const T* g = dy + i * dim;
    const T r = saved.r[size_t(i)];
    T dot = 0;  // Σ_k (w ⊙ dy)_k x_k
    for (int64_t k = 0; k < dim; ++k) dot += (w ? w[k] : T(1)) * g[k] * xr[k];
    const T c = dot * r * r * r / T(dim);
    for (int64_t k = 0; k < dim; ++k) {
      dx[i * dim + k] += r * (w ? w[k] : T(1)) * g[k] - xr[k] * c;
      if (dw) dw[k] += g[k] * xr[k] * r;
    }
  }
}

}  // namespace dsv41::grad
