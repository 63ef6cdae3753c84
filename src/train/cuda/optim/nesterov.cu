// The Nesterov momentum step (nesterov.h): one thread per element, 12 bytes of traffic per element
// (16 with the look-ahead).
#include "train/cuda/optim/nesterov.h"

#include "backend/cuda/check.h"
#include "train/cuda/optim/nesterov.cuh"

namespace dsv41::train_cuda::optim {

namespace {

__global__ void nesterov_kernel(const float* grad, float* momentum, int64_t n, float mu, float* lookahead) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grad[i];
  const float m = nesterov_momentum(momentum[i], g, mu);
  momentum[i] = m;
  if (lookahead) lookahead[i] = nesterov_lookahead(m, g, mu);
}

}  // namespace

void nesterov_momentum(const float* grad, float* momentum, int64_t n, float mu, float* lookahead, cudaStream_t stream) {
  if (n <= 0) return;
  nesterov_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(grad, momentum, n, mu, lookahead);
  cuda::check_launch("train_cuda::optim::nesterov_momentum");
}

}  // namespace dsv41::train_cuda::optim
