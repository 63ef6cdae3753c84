// The vision tower's element-wise ops (vision.h): one thread per output value, each reading its
// inputs once (traffic: the tensors' bytes, 4 per value). Each evaluates the CPU op's expression in
// the same order (--fmad=false, the rounding intrinsics spelled out), with CUDA's full-precision
// expf/erff in place of the C library's (last-bit differences, which the bf16 rounding after them
// mostly absorbs).
#include "backend/cuda/vision.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/linear.h"
#include "base/error.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;

unsigned blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

// y[m, n] = bf16(y[m, n] + bias[n]); bias as bf16 bits or fp32.
template <bool kBf16>
__global__ void bias_round_kernel(float* y, int64_t M, int64_t N, const void* bias) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  float b = 0.0f;
  if (bias) b = kBf16 ? bf16_to_float(static_cast<const uint16_t*>(bias)[i % N]) : static_cast<const float*>(bias)[i % N];
  y[i] = round_bf16(__fadd_rn(y[i], b));
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = round_bf16(__fadd_rn(x[i], y[i]));
}

__global__ void silu_mul_kernel(const float* gu, int64_t M, int64_t inter, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * inter) return;
  const int64_t m = i / inter, j = i % inter;
  const float g = gu[m * 2 * inter + j], up = gu[m * 2 * inter + inter + j];
  const float silu = round_bf16(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))));
  out[i] = round_bf16(__fmul_rn(silu, up));
}

__global__ void gelu_kernel(float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float e = erff(__fmul_rn(v, float(M_SQRT1_2)));
  x[i] = round_bf16(__fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, e)));
}

}  // namespace

void linear_bias(const float* x, int64_t M, const Weight& w, const Weight* bias, float* y, cudaStream_t stream) {
  if (M <= 0) return;
  if (bias && (bias->rows * bias->cols != w.rows || (bias->format != WeightFormat::BF16 && bias->format != WeightFormat::F32)))
    fail("cuda::linear_bias", "a BF16 or F32 bias of " + std::to_string(w.rows) + " values",
         std::to_string(bias->rows * bias->cols) + " values");
  linear_f32(x, M, w, y, stream);
  const void* b = bias ? bias->data : nullptr;
  if (bias && bias->format == WeightFormat::F32) bias_round_kernel<false><<<blocks(M * w.rows), kThreads, 0, stream>>>(y, M, w.rows, b);
  else bias_round_kernel<true><<<blocks(M * w.rows), kThreads, 0, stream>>>(y, M, w.rows, b);
  check_launch("cuda::linear_bias");
}

void add_bf16(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<blocks(n), kThreads, 0, stream>>>(x, y, n);
  check_launch("cuda::add_bf16");
}

void silu_mul(const float* gu, int64_t M, int64_t inter, float* out, cudaStream_t stream) {
  if (M * inter <= 0) return;
  silu_mul_kernel<<<blocks(M * inter), kThreads, 0, stream>>>(gu, M, inter, out);
  check_launch("cuda::silu_mul");
}

void gelu(float* x, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  gelu_kernel<<<blocks(n), kThreads, 0, stream>>>(x, n);
  check_launch("cuda::gelu");
}

}  // namespace dsv41::cuda
