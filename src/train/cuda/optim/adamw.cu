// AdamW on the device (adamw.h): one thread per element, 28 bytes of traffic per element.
#include "train/cuda/optim/adamw.h"

#include <cmath>
#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"

namespace dsv41::train_cuda::optim {

namespace {

// The per-step scalars, as src/train/optim/adamw.cpp computes them.
struct AdamWScalars {
  float beta1, beta2, eps, step_size, inv_sqrt_bc2, decay;
};

__global__ void adamw_kernel(float* w, const float* grad, float* m, float* v, int64_t n, AdamWScalars s) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i];
  const float mi = s.beta1 * m[i] + (1 - s.beta1) * g;
  const float vi = s.beta2 * v[i] + (1 - s.beta2) * (g * g);
  m[i] = mi;
  v[i] = vi;
  const float denom = sqrtf(vi) * s.inv_sqrt_bc2 + s.eps;
  w[i] = w[i] * s.decay - s.step_size * (mi / denom);
}

}  // namespace

void adamw_step(float* w, const float* grad, float* m, float* v, int64_t n, int64_t step, float lr,
                const dsv41::optim::AdamWOptions& o, cudaStream_t stream) {
  if (step < 1) fail("train_cuda::optim::adamw_step", "a step count of at least 1", std::to_string(step));
  if (n <= 0) return;
  const double bc1 = 1 - std::pow(double(o.beta1), double(step));
  const double bc2 = 1 - std::pow(double(o.beta2), double(step));
  const AdamWScalars s{o.beta1, o.beta2, o.eps, float(lr / bc1), float(1 / std::sqrt(bc2)), 1 - lr * o.weight_decay};
  adamw_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(w, grad, m, v, n, s);
  cuda::check_launch("train_cuda::optim::adamw_step");
}

}  // namespace dsv41::train_cuda::optim
