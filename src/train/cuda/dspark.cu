// DSpark's heads and loss (dspark.h). The confidence head: one
// thread per row (forward: its d + rank products in the CPU's order) and, backward, one thread per
// value of dx/de and one per column of dw (its rows in order): the CPU's bits. The loss: one block
// per row of the whole batch over the vocabulary, as the cross-entropy (max, Σ exp, p written,
// ‖p − q‖₁ and the held signs' sum as block trees), each sequence's rows' parts then added in row
// order in double by one thread per sequence; backward one block per row (Σ p g as a tree). Traffic per row: z, q read and p written forward
// (12 bytes per logit), p and the signs read and dz read and written backward (13).
#include "train/cuda/dspark.h"

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 512;

__global__ void confidence_kernel(const float* x, const float* e, int64_t rows, int64_t d, int64_t rank, const float* w,
                                  float* c) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows) return;
  float s = 0;
  for (int64_t j = 0; j < d; ++j) s = __fadd_rn(s, __fmul_rn(w[j], x[i * d + j]));
  for (int64_t j = 0; j < rank; ++j) s = __fadd_rn(s, __fmul_rn(w[d + j], e[i * rank + j]));
  c[i] = s;
}

// dx [rows, d] and de [rows, rank] as one [rows, d + rank] range of values.
__global__ void confidence_dinput_kernel(int64_t rows, int64_t d, int64_t rank, const float* w, const float* dc, float* dx,
                                         float* de) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * (d + rank)) return;
  const int64_t i = id / (d + rank), j = id % (d + rank);
  if (j < d && dx) dx[i * d + j] = __fadd_rn(dx[i * d + j], __fmul_rn(dc[i], w[j]));
  if (j >= d && de) de[i * rank + j - d] = __fadd_rn(de[i * rank + j - d], __fmul_rn(dc[i], w[j]));
}

__global__ void confidence_dw_kernel(const float* x, const float* e, int64_t rows, int64_t d, int64_t rank, const float* dc,
                                     float* dw) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= d + rank) return;
  float acc = dw[j];
  for (int64_t i = 0; i < rows; ++i)
    acc = __fadd_rn(acc, __fmul_rn(dc[i], j < d ? x[i * d + j] : e[i * rank + j - d]));
  dw[j] = acc;
}

// Per row: p, the signs (unless held), c* (unless held) and the row's four parts [rows, 4].
__global__ void __launch_bounds__(kThreads) loss_row_kernel(const float* z, const float* q, int64_t vocab, const int64_t* next,
                                                            const float* c, const float* rho, const float* kappa,
                                                            DSparkLabels labels, float* p, float* row_parts) {
  __shared__ float scratch[kThreads / 32];
  const int64_t i = blockIdx.x;
  const float *zi = z + i * vocab, *qi = q + i * vocab;
  float* pi = p + i * vocab;
  int8_t* signs = labels.signs + i * vocab;
  float mx = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) mx = fmaxf(mx, zi[v]);
  mx = block_max<kThreads>(mx, scratch);
  float sum = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) sum = __fadd_rn(sum, expf(__fsub_rn(zi[v], mx)));
  sum = block_sum<kThreads>(sum, scratch);
  float l1 = 0, l1_held = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    pi[v] = __fdiv_rn(expf(__fsub_rn(zi[v], mx)), sum);
    const float diff = __fsub_rn(pi[v], qi[v]);
    l1 = __fadd_rn(l1, fabsf(diff));
    if (!labels.held) signs[v] = diff > 0 ? 1 : diff < 0 ? -1 : 0;
    l1_held = __fadd_rn(l1_held, __fmul_rn(float(signs[v]), diff));
  }
  l1 = block_sum<kThreads>(l1, scratch);
  l1_held = block_sum<kThreads>(l1_held, scratch);
  if (threadIdx.x != 0) return;
  if (!labels.held) labels.target[i] = float(1.0 - 0.5 * double(l1));
  const float target = labels.target[i];
  // BCE(σ(c), t) = softplus(c) − t c, written to stay finite for any c.
  const float softplus = __fadd_rn(fmaxf(c[i], 0.0f), log1pf(expf(-fabsf(c[i]))));
  float* parts = row_parts + i * 4;
  parts[0] = __fmul_rn(rho[i], __fsub_rn(__fadd_rn(mx, logf(sum)), zi[next[i]]));
  parts[1] = __fmul_rn(rho[i], l1_held);
  parts[2] = __fmul_rn(kappa[i], __fsub_rn(softplus, __fmul_rn(target, c[i])));
  parts[3] = __fmul_rn(kappa[i], target);
}

// parts[4s .. 4s + 3]: sequence s's rows' parts added in row order: one thread per sequence.
__global__ void loss_total_kernel(const float* row_parts, const int64_t* begin, double* parts) {
  const int64_t s = blockIdx.x;
  double sums[4] = {0, 0, 0, 0};
  for (int64_t i = begin[s]; i < begin[s + 1]; ++i)
    for (int k = 0; k < 4; ++k) sums[k] = __dadd_rn(sums[k], double(row_parts[i * 4 + k]));
  for (int k = 0; k < 4; ++k) parts[4 * s + k] = sums[k];
}

__global__ void __launch_bounds__(kThreads) loss_backward_kernel(const float* c, int64_t vocab, const int64_t* next,
                                                                 const float* rho, const float* kappa, DSparkLabels labels,
                                                                 const float* p, float alpha_ce, float alpha_tv,
                                                                 float alpha_conf, float dloss, float* dz, float* dc) {
  __shared__ float scratch[kThreads / 32];
  const int64_t i = blockIdx.x;
  const float* pi = p + i * vocab;
  const int8_t* signs = labels.signs + i * vocab;
  float* dzi = dz + i * vocab;
  const float tv = __fmul_rn(__fmul_rn(dloss, alpha_tv), rho[i]);
  float pg = 0;  // Σ p g, g = tv · sign
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) pg = __fadd_rn(pg, __fmul_rn(pi[v], __fmul_rn(tv, float(signs[v]))));
  pg = block_sum<kThreads>(pg, scratch);
  const float ce = __fmul_rn(__fmul_rn(dloss, alpha_ce), rho[i]);
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) {
    const float g = __fmul_rn(tv, float(signs[v]));
    dzi[v] = __fadd_rn(dzi[v], __fadd_rn(__fmul_rn(pi[v], __fsub_rn(g, pg)), __fmul_rn(ce, pi[v])));
  }
  __syncthreads();  // the thread that owns next[i] has written it
  if (threadIdx.x != 0) return;
  dzi[next[i]] = __fsub_rn(dzi[next[i]], ce);
  const float sigma = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-c[i])));
  dc[i] = __fadd_rn(dc[i], __fmul_rn(__fmul_rn(__fmul_rn(dloss, alpha_conf), kappa[i]), __fsub_rn(sigma, labels.target[i])));
}

unsigned blocks_of(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace

void confidence_forward(const float* x, const float* e, int64_t rows, int64_t d, int64_t rank, const float* w, float* c,
                        cudaStream_t stream) {
  if (rows <= 0) return;
  confidence_kernel<<<blocks_of(rows, 128), 128, 0, stream>>>(x, e, rows, d, rank, w, c);
  cuda::check_launch("train_cuda::confidence_forward");
}

void confidence_backward(const float* x, const float* e, int64_t rows, int64_t d, int64_t rank, const float* w, const float* dc,
                         float* dx, float* de, float* dw, cudaStream_t stream) {
  if (rows <= 0 || d + rank <= 0) return;
  if (dx || de) {
    confidence_dinput_kernel<<<blocks_of(rows * (d + rank), 256), 256, 0, stream>>>(rows, d, rank, w, dc, dx, de);
    cuda::check_launch("train_cuda::confidence_backward");
  }
  if (dw) {
    confidence_dw_kernel<<<blocks_of(d + rank, 128), 128, 0, stream>>>(x, e, rows, d, rank, dc, dw);
    cuda::check_launch("train_cuda::confidence_backward");
  }
}

void dspark_loss_forward(const float* z, const float* q, int64_t rows, int64_t vocab, const int64_t* next, const float* c,
                         const float* rho, const float* kappa, const int64_t* begin, int64_t sequences,
                         const DSparkLabels& labels, float* p, double* parts, cudaStream_t stream) {
  if (sequences <= 0) return;
  cuda::DeviceBuffer<float> row_parts = cuda::scratch<float>(rows * 4, stream);
  if (rows > 0) {
    loss_row_kernel<<<unsigned(rows), kThreads, 0, stream>>>(z, q, vocab, next, c, rho, kappa, labels, p, row_parts.get());
    cuda::check_launch("train_cuda::dspark_loss_forward");
  }
  loss_total_kernel<<<unsigned(sequences), 1, 0, stream>>>(row_parts.get(), begin, parts);
  cuda::check_launch("train_cuda::dspark_loss_forward");
}

void dspark_loss_backward(const float* c, int64_t rows, int64_t vocab, const int64_t* next, const float* rho, const float* kappa,
                          const DSparkLabels& labels, const float* p, float alpha_ce, float alpha_tv, float alpha_conf,
                          float dloss, float* dz, float* dc, cudaStream_t stream) {
  if (rows <= 0) return;
  loss_backward_kernel<<<unsigned(rows), kThreads, 0, stream>>>(c, vocab, next, rho, kappa, labels, p, alpha_ce, alpha_tv,
                                                                alpha_conf, dloss, dz, dc);
  cuda::check_launch("train_cuda::dspark_loss_backward");
}

}  // namespace dsv41::train_cuda
