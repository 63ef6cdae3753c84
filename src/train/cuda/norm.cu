// RMSNorm forward and backward (norm.h).
//
// Forward: one block per row; the row read twice (the sum of squares, then the scaled write, the
// second time from L1/L2), y written once: 8·rows·dim bytes. Backward, dx: one block per row, x and
// dy read twice, dx read and written: 16·rows·dim bytes. Backward, dw: blocks of 256 columns × 64
// rows write one partial sum per column (x and dy read once more), a second launch adds each
// column's partials in chunk order into dw. Every product is rounded in the CPU op's order
// (--fmad=false); only the order of the sums differs.
#include "train/cuda/norm.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 64;  // rows per partial sum of dw

__device__ inline float weight_at(const float* w, int64_t k) { return w ? w[k] : 1.0f; }

__global__ void __launch_bounds__(kThreads) forward_kernel(const float* x, int64_t dim, const float* w, float eps, float* y,
                                                           float* r) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * dim;
  float sum = 0;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads) sum = __fadd_rn(sum, __fmul_rn(xr[k], xr[k]));
  const float total = block_sum<kThreads>(sum, scratch);
  // Correctly rounded division and square root (no fast math), as the CPU's 1 / std::sqrt.
  const float inv = 1.0f / sqrtf(total / float(dim) + eps);
  if (threadIdx.x == 0) r[row] = inv;
  // Each thread rewrites only the elements it read: y may be x.
  float* yr = y + row * dim;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads) yr[k] = __fmul_rn(weight_at(w, k), __fmul_rn(xr[k], inv));
}

__global__ void __launch_bounds__(kThreads) backward_dx_kernel(const float* x, int64_t dim, const float* w, const float* r,
                                                               const float* dy, float* dx) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const float *xr = x + row * dim, *g = dy + row * dim;
  const float rr = r[row];
  float dot = 0;  // Σ_k (w ⊙ dy)_k x_k
  for (int64_t k = threadIdx.x; k < dim; k += kThreads)
    dot = __fadd_rn(dot, __fmul_rn(__fmul_rn(weight_at(w, k), g[k]), xr[k]));
  const float total = block_sum<kThreads>(dot, scratch);
  const float c = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(total, rr), rr), rr), float(dim));
  float* dxr = dx + row * dim;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads)
    dxr[k] = __fadd_rn(dxr[k], __fsub_rn(__fmul_rn(__fmul_rn(rr, weight_at(w, k)), g[k]), __fmul_rn(xr[k], c)));
}

// partial[chunk, k] = Σ over the chunk's rows of dy ⊙ x · r in row order.
__global__ void __launch_bounds__(kThreads) dw_partial_kernel(const float* x, int64_t rows, int64_t dim, const float* r,
                                                              const float* dy, float* partial) {
  const int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= dim) return;
  const int64_t first = int64_t(blockIdx.y) * kChunk, last = min(rows, first + kChunk);
  float sum = 0;
  for (int64_t i = first; i < last; ++i) sum = __fadd_rn(sum, __fmul_rn(__fmul_rn(dy[i * dim + k], x[i * dim + k]), r[i]));
  partial[int64_t(blockIdx.y) * dim + k] = sum;
}

// dw[k] += Σ_chunks partial[chunk, k] in chunk order.
__global__ void __launch_bounds__(kThreads) dw_finish_kernel(const float* partial, int64_t chunks, int64_t dim, float* dw) {
  const int64_t k = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= dim) return;
  float sum = 0;
  for (int64_t c = 0; c < chunks; ++c) sum = __fadd_rn(sum, partial[c * dim + k]);
  dw[k] = __fadd_rn(dw[k], sum);
}

}  // namespace

void rms_norm_forward(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y, float* r,
                      cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  forward_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, dim, w, eps, y, r);
  cuda::check_launch("train_cuda::rms_norm_forward");
}

void rms_norm_backward(const float* x, int64_t rows, int64_t dim, const float* w, const float* r, const float* dy,
                       float* dx, float* dw, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  if (dw && !w) fail("train_cuda::rms_norm_backward", "no dw for an unweighted norm", "a dw pointer");
  backward_dx_kernel<<<unsigned(rows), kThreads, 0, stream>>>(x, dim, w, r, dy, dx);
  cuda::check_launch("train_cuda::rms_norm_backward");
  if (!dw) return;
  const int64_t chunks = (rows + kChunk - 1) / kChunk;
  if (chunks > 65535)
    fail("train_cuda::rms_norm_backward", "at most " + std::to_string(65535 * kChunk) + " rows", std::to_string(rows));
  cuda::DeviceBuffer<float> partial = cuda::scratch<float>(chunks * dim, stream);
  const unsigned column_blocks = unsigned((dim + kThreads - 1) / kThreads);
  dw_partial_kernel<<<dim3(column_blocks, unsigned(chunks)), kThreads, 0, stream>>>(x, rows, dim, r, dy, partial.get());
  cuda::check_launch("train_cuda::rms_norm_backward");
  dw_finish_kernel<<<column_blocks, kThreads, 0, stream>>>(partial.get(), chunks, dim, dw);
  cuda::check_launch("train_cuda::rms_norm_backward");
}

}  // namespace dsv41::train_cuda
