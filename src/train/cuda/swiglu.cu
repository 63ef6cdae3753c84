// The clamped SwiGLU (swiglu.h). Forward: one thread per element, 12 bytes each (g, u read, h
// written). Backward: one block per row (the routing weight's gradient is a sum over the row), 20
// bytes per element (g, u, dh read, dg, du written). The CPU op's operations in its order
// (--fmad=false), with CUDA's full-precision expf (within 2 units in the last place) for the
// sigmoid; the row sum's order differs.
#include "train/cuda/swiglu.h"

#include "backend/cuda/check.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline float sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

__global__ void forward_kernel(const float* gate, const float* up, int64_t rows, int64_t inter, float limit,
                               const float* row_weights, float* hidden) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * inter) return;
  float g = gate[e], u = up[e];
  if (limit > 0) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  const float w = row_weights ? row_weights[e / inter] : 1.0f;
  hidden[e] = __fmul_rn(w, __fmul_rn(__fmul_rn(g, sigmoid(g)), u));
}

__global__ void __launch_bounds__(kThreads) backward_kernel(const float* gate, const float* up, int64_t inter, float limit,
                                                            const float* row_weights, const float* dh, float* dgate,
                                                            float* dup, float* drow_weights) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const float w = row_weights ? row_weights[row] : 1.0f;
  float dw = 0;  // Σ_i dh_i · silu(g'_i) · u'_i over this thread's elements
  for (int64_t i = threadIdx.x; i < inter; i += kThreads) {
    const int64_t e = row * inter + i;
    const float g0 = gate[e], u0 = up[e], d = dh[e];
    // At the clamp's bound the gradient passes (torch's clamp backward: min <= x <= max).
    const bool g_passes = limit <= 0 || g0 <= limit;
    const bool u_passes = limit <= 0 || (u0 >= -limit && u0 <= limit);
    const float g = g_passes ? g0 : limit, u = limit > 0 ? fminf(fmaxf(u0, -limit), limit) : u0;
    const float s = sigmoid(g), silu = __fmul_rn(g, s);
    dw = __fadd_rn(dw, __fmul_rn(__fmul_rn(d, silu), u));
    dup[e] = u_passes ? __fmul_rn(__fmul_rn(d, w), silu) : 0.0f;
    const float slope = __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s)));
    dgate[e] = g_passes ? __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(d, w), u), s), slope) : 0.0f;
  }
  if (!drow_weights) return;  // the same for every thread of the block: no barrier is skipped by some
  const float total = block_sum<kThreads>(dw, scratch);
  if (threadIdx.x == 0) drow_weights[row] = __fadd_rn(drow_weights[row], total);
}

}  // namespace

void swiglu_forward(const float* gate, const float* up, int64_t rows, int64_t inter, float limit, const float* row_weights,
                    float* hidden, cudaStream_t stream) {
  const int64_t n = rows * inter;
  if (n <= 0) return;
  forward_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(gate, up, rows, inter, limit, row_weights, hidden);
  cuda::check_launch("train_cuda::swiglu_forward");
}

void swiglu_backward(const float* gate, const float* up, int64_t rows, int64_t inter, float limit,
                     const float* row_weights, const float* dh, float* dgate, float* dup, float* drow_weights,
                     cudaStream_t stream) {
  if (rows <= 0 || inter <= 0) return;
  backward_kernel<<<unsigned(rows), kThreads, 0, stream>>>(gate, up, inter, limit, row_weights, dh, dgate, dup,
                                                           drow_weights);
  cuda::check_launch("train_cuda::swiglu_backward");
}

}  // namespace dsv41::train_cuda
