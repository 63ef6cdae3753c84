// The Sinkhorn-balanced update on the device (sinkhorn_update.h). Kernels, in the CPU's order of
// steps (src/train/optim/sinkhorn_update.cpp):
//
//   row_norms (first)   ρᵢ, one CUDA block per row (a fixed tree over the columns)
//   mask                ρ̄ (a fixed tree over the rows), rᵢ = 1/(ρᵢ + ε) or 0, m′, c = 1
//   column_partials     Σ over a chunk of 512 rows of (rᵢ Ĝᵢⱼ cⱼ)², one thread per column, rows in order
//   column_scales       cⱼ ← cⱼ √(m′/n) / (√Σ + ε), the chunks' partials in chunk order
//   row_norms (step)    rᵢ ← rᵢ / (‖rᵢ Ĝᵢ c‖ + ε)
//   apply               W ← W − γη · float(√n rᵢ Ĝᵢⱼ cⱼ), nothing when every row is masked
//
// Each pass reads the momentum and the gradient (8 bytes per element); K = 11 makes 12 passes.
#include "train/cuda/optim/sinkhorn_update.h"

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/optim/nesterov.cuh"
#include "train/cuda/optim/nesterov.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda::optim {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowChunk = 512;

// The operand every pass reads: Ĝ from the (updated) momentum and the gradient.
struct Lookahead {
  const float* momentum;
  const float* grad;
  float mu;
  __device__ double operator()(int64_t k) const { return double(nesterov_lookahead(momentum[k], grad[k], mu)); }
};

// first: rho[i] = ‖Ĝᵢ‖ (r = c = 1); else r[i] ← r[i] / (‖rᵢ Ĝᵢ c‖ + ε).
template <bool kFirst>
__global__ void row_norms_kernel(Lookahead g, int64_t cols, const double* c, double* r, double* rho, double eps) {
  __shared__ double scratch[kThreads / 32];
  const int64_t i = blockIdx.x;
  const double ri = kFirst ? 1.0 : r[i];
  double s = 0;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) {
    const double x = kFirst ? g(i * cols + j) : ri * g(i * cols + j) * c[j];  // the CPU's r = c = 1: x = Ĝ
    s += x * x;
  }
  s = block_sum<kThreads>(s, scratch);
  if (threadIdx.x != 0) return;
  if (kFirst) rho[i] = sqrt(s);
  else r[i] = ri / (sqrt(s) + eps);
}

// One block of 1024 threads: the mean of ρ, the mask and the first row normalisation, m′, and c = 1.
constexpr int kMaskThreads = 1024;
__global__ void mask_kernel(const double* rho, int64_t rows, int64_t cols, double tau, double eps, double* r, double* c,
                            int64_t* unmasked) {
  __shared__ double scratch[kMaskThreads / 32];
  __shared__ unsigned long long kept_total;
  double s = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kMaskThreads) s += rho[i];
  const double mean = block_sum<kMaskThreads>(s, scratch) / double(rows);
  if (threadIdx.x == 0) kept_total = 0;
  __syncthreads();
  unsigned long long kept = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kMaskThreads) {
    const bool keep = rho[i] > tau * mean;
    r[i] = keep ? 1 / (rho[i] + eps) : 0;
    kept += keep;
  }
  atomicAdd(&kept_total, kept);  // integers: the same total in any order
  for (int64_t j = threadIdx.x; j < cols; j += kMaskThreads) c[j] = 1;
  __syncthreads();
  if (threadIdx.x == 0) *unmasked = int64_t(kept_total);
}

// partial[chunk · cols + j] = Σ over the chunk's rows, in order, of (rᵢ Ĝᵢⱼ cⱼ)².
__global__ void column_partials_kernel(Lookahead g, int64_t rows, int64_t cols, const double* r, const double* c,
                                       double* partial) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, chunk = blockIdx.y;
  if (j >= cols) return;
  const int64_t end = min(rows, (chunk + 1) * kRowChunk);
  double s = 0;
  for (int64_t i = chunk * kRowChunk; i < end; ++i) {
    const double x = r[i] * g(i * cols + j) * c[j];
    s += x * x;
  }
  partial[chunk * cols + j] = s;
}

__global__ void column_scales_kernel(const double* partial, int64_t chunks, int64_t cols, const int64_t* unmasked, double eps,
                                     double* c) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  double s = 0;
  for (int64_t k = 0; k < chunks; ++k) s += partial[k * cols + j];
  const double target = sqrt(double(*unmasked) / double(cols));
  c[j] *= target / (sqrt(s) + eps);
}

__global__ void apply_kernel(float* W, Lookahead g, int64_t n, int64_t cols, const double* r, const double* c, double alpha,
                             const int64_t* unmasked, float step) {
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= n) return;
  const float u = *unmasked == 0 ? 0.0f : float(alpha * r[k / cols] * g(k) * c[k % cols]);
  W[k] -= step * u;
}

}  // namespace

void sinkhorn_step(float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, float lr,
                   const dsv41::optim::SinkhornOptions& o, cudaStream_t stream) {
  const char* where = "train_cuda::optim::sinkhorn_step";
  if (o.steps < 1 || o.steps % 2 == 0)
    fail(where, "an odd number of steps (the last one normalizes the rows)", std::to_string(o.steps));
  if (rows < 1 || cols < 1) fail(where, "a matrix of at least 1 × 1", std::to_string(rows) + " × " + std::to_string(cols));
  if (rows > INT32_MAX) fail(where, "at most 2^31 - 1 rows (one CUDA block each)", std::to_string(rows));
  const int64_t n = rows * cols, chunks = (rows + kRowChunk - 1) / kRowChunk;
  if (chunks > 65535) fail(where, "at most 65535 chunks of 512 rows (a grid's second dimension)", std::to_string(rows) + " rows");
  nesterov_momentum(grad, momentum, n, o.momentum, nullptr, stream);

  cuda::DeviceBuffer<double> r(rows, stream, true), rho(rows, stream, true), c(cols, stream, true),
      partial(chunks * cols, stream, true);
  cuda::DeviceBuffer<int64_t> unmasked(1, stream, true);
  const Lookahead g{momentum, grad, o.momentum};
  const double eps = o.eps;
  const unsigned col_blocks = unsigned((cols + kThreads - 1) / kThreads);

  // The first row norms read neither r nor c (both 1 there); the mask kernel then sets them.
  row_norms_kernel<true><<<unsigned(rows), kThreads, 0, stream>>>(g, cols, nullptr, nullptr, rho.get(), eps);
  cuda::check_launch(where);
  mask_kernel<<<1, kMaskThreads, 0, stream>>>(rho.get(), rows, cols, double(o.tau), eps, r.get(), c.get(), unmasked.get());
  cuda::check_launch(where);
  for (int step = 2; step <= o.steps; ++step) {
    if (step % 2 == 0) {
      column_partials_kernel<<<dim3(col_blocks, unsigned(chunks)), kThreads, 0, stream>>>(g, rows, cols, r.get(), c.get(),
                                                                                         partial.get());
      cuda::check_launch(where);
      column_scales_kernel<<<col_blocks, kThreads, 0, stream>>>(partial.get(), chunks, cols, unmasked.get(), eps, c.get());
    } else {
      row_norms_kernel<false><<<unsigned(rows), kThreads, 0, stream>>>(g, cols, c.get(), r.get(), nullptr, eps);
    }
    cuda::check_launch(where);
  }
  const double alpha = std::sqrt(double(cols));
  const float step = o.lr_correction * lr;
  apply_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(W, g, n, cols, r.get(), c.get(), alpha,
                                                                                 unmasked.get(), step);
  cuda::check_launch(where);
}

}  // namespace dsv41::train_cuda::optim
