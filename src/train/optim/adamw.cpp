#include "train/optim/adamw.h"

#include <cmath>
#include <string>

#include "base/error.h"

namespace dsv41::optim {

void adamw_step(float* w, const float* grad, float* m, float* v, int64_t n, int64_t step, float lr,
                const AdamWOptions& o) {
  if (step < 1) fail("adamw_step", "a step count of at least 1", std::to_string(step));
  const double bc1 = 1 - std::pow(double(o.beta1), double(step));
  const double bc2 = 1 - std::pow(double(o.beta2), double(step));
  const float step_size = float(lr / bc1), inv_sqrt_bc2 = float(1 / std::sqrt(bc2));
  const float decay = 1 - lr * o.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
    v[i] = o.beta2 * v[i] + (1 - o.beta2) * (g * g);
    const float denom = std::sqrt(v[i]) * inv_sqrt_bc2 + o.eps;
    w[i] = w[i] * decay - step_size * (m[i] / denom);
  }
}

}  // namespace dsv41::optim
