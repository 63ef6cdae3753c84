// Engram's gate (engram.h). Forward: one block per (token, stream): the three sums over d (A, h², key²)
// as block trees, then h' = h + g · value; reads h, key, value, the two weight rows, writes h'.
// Backward: one block per token, its streams in order (the shared value's gradient adds them in
// the CPU's order): dg as a block tree, then each channel's updates with the CPU's operations in
// its order; dA per (token, stream) to scratch. The weights' gradients, sums over all tokens: blocks
// of 64 tokens × 256 (stream, channel) columns write partials, a second launch adds them in chunk
// order (no atomics). Only the sums over d and over the tokens differ from the CPU in order.
#include "train/cuda/engram.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = 64;     // tokens per partial sum of the weights' gradients
constexpr float kClamp = 1e-6f;    // model.py Engram.clamp_value: the floor under |dot|

__device__ inline float sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

__global__ void __launch_bounds__(kThreads) forward_kernel(const float* X, const float* kv, const float* q_weight,
                                                           const float* k_weight, int hc, int64_t d, float eps, float* out,
                                                           EngramGateSaved saved) {
  __shared__ float scratch[kThreads / 32];
  const int64_t s = blockIdx.x, r = s / hc, m = s % hc;
  const float* h = X + s * d;
  const float* key = kv + (r * (hc + 1) + m) * d;
  const float* value = kv + (r * (hc + 1) + hc) * d;
  const float *q = q_weight + m * d, *k = k_weight + m * d;
  float A = 0, hh = 0, kk = 0;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    A = __fadd_rn(A, __fmul_rn(__fmul_rn(__fmul_rn(h[i], q[i]), k[i]), key[i]));
    hh = __fadd_rn(hh, __fmul_rn(h[i], h[i]));
    kk = __fadd_rn(kk, __fmul_rn(key[i], key[i]));
  }
  A = block_sum<kThreads>(A, scratch);
  hh = block_sum<kThreads>(hh, scratch);
  kk = block_sum<kThreads>(kk, scratch);
  const float inv_sqrt_d = 1.0f / sqrtf(float(d));
  const float rh = 1.0f / sqrtf(hh / float(d) + eps), rk = 1.0f / sqrtf(kk / float(d) + eps);
  const float dot = __fmul_rn(__fmul_rn(__fmul_rn(A, rh), rk), inv_sqrt_d);
  const float g = sigmoid(copysignf(sqrtf(fmaxf(fabsf(dot), kClamp)), dot));
  if (threadIdx.x == 0) saved.A[s] = A, saved.rh[s] = rh, saved.rk[s] = rk, saved.dot[s] = dot, saved.gate[s] = g;
  float* o = out + s * d;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) o[i] = __fadd_rn(h[i], __fmul_rn(g, value[i]));
}

__global__ void __launch_bounds__(kThreads) backward_kernel(const float* X, const float* kv, const float* q_weight,
                                                            const float* k_weight, int hc, int64_t d, EngramGateSaved saved,
                                                            const float* dout, float* dX, float* dkv, float* dA_out) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* value = kv + (r * (hc + 1) + hc) * d;
  float* dvalue = dkv + (r * (hc + 1) + hc) * d;
  const float inv_sqrt_d = 1.0f / sqrtf(float(d));
  for (int m = 0; m < hc; ++m) {
    const int64_t s = r * hc + m;
    const float *h = X + s * d, *key = kv + (r * (hc + 1) + m) * d, *g_out = dout + s * d;
    float *dh = dX + s * d, *dkey = dkv + (r * (hc + 1) + m) * d;
    const float *q = q_weight + m * d, *k = k_weight + m * d;
    const float g = saved.gate[s], dot = saved.dot[s], A = saved.A[s], rh = saved.rh[s], rk = saved.rk[s];
    float dg = 0;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      dvalue[i] = __fadd_rn(dvalue[i], __fmul_rn(g, g_out[i]));
      dg = __fadd_rn(dg, __fmul_rn(g_out[i], value[i]));
      dh[i] = __fadd_rn(dh[i], g_out[i]);
    }
    dg = block_sum<kThreads>(dg, scratch);
    const float droot = fabsf(dot) > kClamp ? __fdiv_rn(1.0f, __fmul_rn(2.0f, sqrtf(fabsf(dot)))) : 0.0f;
    const float ddot = __fmul_rn(__fmul_rn(__fmul_rn(dg, g), __fsub_rn(1.0f, g)), droot);
    const float dA = __fmul_rn(__fmul_rn(__fmul_rn(ddot, rh), rk), inv_sqrt_d);
    const float drh = __fmul_rn(__fmul_rn(__fmul_rn(ddot, A), rk), inv_sqrt_d);
    const float drk = __fmul_rn(__fmul_rn(__fmul_rn(ddot, A), rh), inv_sqrt_d);
    const float ch = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(drh, rh), rh), rh), float(d));
    const float ck = __fdiv_rn(__fmul_rn(__fmul_rn(__fmul_rn(drk, rk), rk), rk), float(d));
    if (threadIdx.x == 0) dA_out[s] = dA;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      const float dAqk = __fmul_rn(__fmul_rn(dA, q[i]), k[i]);
      dh[i] = __fadd_rn(dh[i], __fsub_rn(__fmul_rn(dAqk, key[i]), __fmul_rn(ch, h[i])));
      dkey[i] = __fadd_rn(dkey[i], __fsub_rn(__fmul_rn(dAqk, h[i]), __fmul_rn(ck, key[i])));
    }
  }
}

// Columns j = m·d + i of [hc, d]: partial[chunk, j] = Σ over the chunk's tokens of dA·h·key·k (q
// for dk_weight's), in token order.
__global__ void __launch_bounds__(kThreads) weights_partial_kernel(const float* X, const float* kv, const float* q_weight,
                                                                   const float* k_weight, int64_t rows, int hc, int64_t d,
                                                                   const float* dA, float* partial_q, float* partial_k) {
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= hc * d) return;
  const int64_t m = j / d, i = j % d, first = int64_t(blockIdx.y) * kChunk, last = min(rows, first + kChunk);
  float sq = 0, sk = 0;
  for (int64_t r = first; r < last; ++r) {
    const float hk = __fmul_rn(__fmul_rn(dA[r * hc + m], X[(r * hc + m) * d + i]), kv[(r * (hc + 1) + m) * d + i]);
    sq = __fadd_rn(sq, __fmul_rn(hk, k_weight[j]));
    sk = __fadd_rn(sk, __fmul_rn(hk, q_weight[j]));
  }
  partial_q[int64_t(blockIdx.y) * hc * d + j] = sq;
  partial_k[int64_t(blockIdx.y) * hc * d + j] = sk;
}

__global__ void __launch_bounds__(kThreads) weights_finish_kernel(const float* partial_q, const float* partial_k, int64_t chunks,
                                                                  int64_t columns, float* dq_weight, float* dk_weight) {
  const int64_t j = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= columns) return;
  float sq = 0, sk = 0;
  for (int64_t c = 0; c < chunks; ++c) sq = __fadd_rn(sq, partial_q[c * columns + j]), sk = __fadd_rn(sk, partial_k[c * columns + j]);
  dq_weight[j] = __fadd_rn(dq_weight[j], sq);
  dk_weight[j] = __fadd_rn(dk_weight[j], sk);
}

}  // namespace

void engram_gate_forward(const float* X, const float* kv, const float* q_weight, const float* k_weight, int64_t rows, int hc,
                         int64_t d, float eps, float* out, const EngramGateSaved& saved, cudaStream_t stream) {
  if (rows <= 0 || hc <= 0 || d <= 0) return;
  forward_kernel<<<unsigned(rows * hc), kThreads, 0, stream>>>(X, kv, q_weight, k_weight, hc, d, eps, out, saved);
  cuda::check_launch("train_cuda::engram_gate_forward");
}

void engram_gate_backward(const float* X, const float* kv, const float* q_weight, const float* k_weight, int64_t rows, int hc,
                          int64_t d, const EngramGateSaved& saved, const float* dout, float* dX, float* dkv, float* dq_weight,
                          float* dk_weight, cudaStream_t stream) {
  const char* where = "train_cuda::engram_gate_backward";
  if (rows <= 0 || hc <= 0 || d <= 0) return;
  const int64_t chunks = (rows + kChunk - 1) / kChunk, columns = hc * d;
  if (chunks > 65535) fail(where, "at most " + std::to_string(65535 * kChunk) + " tokens", std::to_string(rows));
  cuda::DeviceBuffer<float> dA = cuda::scratch<float>(rows * hc, stream);
  backward_kernel<<<unsigned(rows), kThreads, 0, stream>>>(X, kv, q_weight, k_weight, hc, d, saved, dout, dX, dkv, dA.get());
  cuda::check_launch(where);
  cuda::DeviceBuffer<float> partial_q = cuda::scratch<float>(chunks * columns, stream);
  cuda::DeviceBuffer<float> partial_k = cuda::scratch<float>(chunks * columns, stream);
  const unsigned column_blocks = unsigned((columns + kThreads - 1) / kThreads);
  weights_partial_kernel<<<dim3(column_blocks, unsigned(chunks)), kThreads, 0, stream>>>(X, kv, q_weight, k_weight, rows, hc, d,
                                                                                         dA.get(), partial_q.get(), partial_k.get());
  cuda::check_launch(where);
  weights_finish_kernel<<<column_blocks, kThreads, 0, stream>>>(partial_q.get(), partial_k.get(), chunks, columns, dq_weight,
                                                                dk_weight);
  cuda::check_launch(where);
}

}  // namespace dsv41::train_cuda
