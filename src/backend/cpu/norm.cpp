#include "backend/cpu/norm.h"

#include <cmath>
#include <vector>

#include "numerics/types.h"

namespace dsv41 {

float rms_inverse(const float* x, int64_t n, float eps) {
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return 1.0f / std::sqrt(sum / float(n) + eps);
}

void rms_norm(const float* x, int64_t rows, int64_t dim, const Weight* weight, float eps, float* y) {
  std::vector<float> w(size_t(dim), 1.0f);
  if (weight) weight->row(0, w.data());
#pragma omp parallel for schedule(static) if (rows * dim >= (int64_t(1) << 16))
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const float inv = rms_inverse(xr, dim, eps);
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] = round_bf16(w[i] * (xr[i] * inv));
  }
}

}  // namespace dsv41
