// Elementwise sums (elementwise.h): 12 bytes of traffic a value (x, y read; y written).
#include "train/cuda/elementwise.h"

#include "backend/cuda/check.h"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 256;

__global__ void add_kernel(const float* x, int64_t n, float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fadd_rn(y[i], x[i]);
}

__global__ void add_scaled_kernel(const float* x, int64_t n, float s, float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __fadd_rn(y[i], __fmul_rn(s, x[i]));
}

unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void add_into(const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks(n), kThreads, 0, stream>>>(x, n, y);
  cuda::check_launch("train_cuda::add_into");
}

void add_scaled_into(const float* x, int64_t n, float s, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  add_scaled_kernel<<<blocks(n), kThreads, 0, stream>>>(x, n, s, y);
  cuda::check_launch("train_cuda::add_scaled_into");
}

}  // namespace dsv41::train_cuda
