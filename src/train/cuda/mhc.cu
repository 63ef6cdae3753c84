// mHC (mhc.h). hc_mixes: fn · vec X is linear.h's fp32 product; the inverse RMS one block a row
// (reads hc·d values); the Sinkhorn tail one thread a row ((2 + hc)·hc values in, 2hc + hc² out,
// ~4·iters·hc² flops), its backward recomputing the 2·iters − 1 iterates it differentiates into a
// scratch laid out [iterate, entry, row] (a warp's threads, consecutive rows, touch consecutive
// words: 4·(2·iters − 1)·hc² bytes a row written and read), each row's dbase and dscale parts in a
// scratch [3 + (2 + hc)·hc, rows] summed over the rows by one block a column. The scalar arithmetic
// is the CPU's, operation for operation (this library builds with --fmad=false); only expf and the
// order of the sums over channels and rows differ.
//
// hc_pre, hc_post, hc_expand: every value that is a sum over the streams (hc terms) is formed by
// one thread in the CPU loop's order, so y, X', dX, df and dx are the CPU's bits; the sums over a
// row's d channels (dpre, dpost, dcomb) are block trees. Traffic, per row of d channels and hc
// streams, 4 bytes a value: hc_pre forward (hc + 1)·d read/written, backward 3hc·d + d; hc_post
// forward 2hc·d + d, backward 4hc·d + 3d; hc_expand (hc + 1)·d either way.
#include "train/cuda/mhc.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 256;

template <int HC>
__global__ void pre_forward_kernel(const float* X, const float* pre, int64_t rows, int64_t d, float* y) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * d) return;
  const int64_t r = e / d, k = e % d;
  float sum = 0;
#pragma unroll
  for (int i = 0; i < HC; ++i) sum = __fadd_rn(sum, __fmul_rn(pre[r * HC + i], X[(r * HC + i) * d + k]));
  y[e] = sum;
}

// One block per row.
template <int HC>
__global__ void __launch_bounds__(kThreads) pre_backward_kernel(const float* X, const float* pre, int64_t d, const float* dy,
                                                                float* dX, float* dpre) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float dot[HC] = {};
  for (int64_t k = threadIdx.x; k < d; k += kThreads) {
    const float g = dy[r * d + k];
#pragma unroll
    for (int i = 0; i < HC; ++i) {
      const int64_t at = (r * HC + i) * d + k;
      dX[at] = __fadd_rn(dX[at], __fmul_rn(pre[r * HC + i], g));
      dot[i] = __fadd_rn(dot[i], __fmul_rn(g, X[at]));
    }
  }
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    const float total = block_sum<kThreads>(dot[i], scratch);
    if (threadIdx.x == 0) dpre[r * HC + i] = __fadd_rn(dpre[r * HC + i], total);
  }
}

template <int HC>
__global__ void post_forward_kernel(const float* f, const float* X, const float* post, const float* comb, int64_t rows,
                                   int64_t d, float* out) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * d) return;
  const int64_t r = e / d, k = e % d;
  float x[HC];
#pragma unroll
  for (int i = 0; i < HC; ++i) x[i] = X[(r * HC + i) * d + k];
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    float mix = 0;
#pragma unroll
    for (int i = 0; i < HC; ++i) mix = __fadd_rn(mix, __fmul_rn(comb[(r * HC + i) * HC + j], x[i]));
    out[(r * HC + j) * d + k] = __fadd_rn(__fmul_rn(post[r * HC + j], f[e]), mix);
  }
}

// One block per row.
template <int HC>
__global__ void __launch_bounds__(kThreads) post_backward_kernel(const float* f, const float* X, const float* post,
                                                                 const float* comb, int64_t d, const float* dout, float* df,
                                                                 float* dX, float* dpost, float* dcomb) {
  __shared__ float scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float dp[HC] = {}, dc[HC][HC] = {};  // this thread's part of dpost_j and dcomb_ij
  for (int64_t k = threadIdx.x; k < d; k += kThreads) {
    float g[HC], x[HC];
#pragma unroll
    for (int j = 0; j < HC; ++j) g[j] = dout[(r * HC + j) * d + k], x[j] = X[(r * HC + j) * d + k];
    const float fk = f[r * d + k];
    float acc = df[r * d + k];
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      acc = __fadd_rn(acc, __fmul_rn(post[r * HC + j], g[j]));
      dp[j] = __fadd_rn(dp[j], __fmul_rn(g[j], fk));
#pragma unroll
      for (int i = 0; i < HC; ++i) dc[i][j] = __fadd_rn(dc[i][j], __fmul_rn(g[j], x[i]));
    }
    df[r * d + k] = acc;
#pragma unroll
    for (int i = 0; i < HC; ++i) {
      const int64_t at = (r * HC + i) * d + k;
      float sum = dX[at];
#pragma unroll
      for (int j = 0; j < HC; ++j) sum = __fadd_rn(sum, __fmul_rn(comb[(r * HC + i) * HC + j], g[j]));
      dX[at] = sum;
    }
  }
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    const float total = block_sum<kThreads>(dp[j], scratch);
    if (threadIdx.x == 0) dpost[r * HC + j] = __fadd_rn(dpost[r * HC + j], total);
  }
#pragma unroll
  for (int i = 0; i < HC; ++i)
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      const float total = block_sum<kThreads>(dc[i][j], scratch);
      if (threadIdx.x == 0) dcomb[(r * HC + i) * HC + j] = __fadd_rn(dcomb[(r * HC + i) * HC + j], total);
    }
}

template <int HC>
__global__ void expand_forward_kernel(const float* x, int64_t rows, int64_t d, float* X) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * d) return;
  const int64_t r = e / d, k = e % d;
#pragma unroll
  for (int i = 0; i < HC; ++i) X[(r * HC + i) * d + k] = x[e];
}

template <int HC>
__global__ void expand_backward_kernel(const float* dX, int64_t rows, int64_t d, float* dx) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * d) return;
  const int64_t r = e / d, k = e % d;
  float acc = dx[e];
#pragma unroll
  for (int i = 0; i < HC; ++i) acc = __fadd_rn(acc, dX[(r * HC + i) * d + k]);
  dx[e] = acc;
}

// --- hc_mixes -----------------------------------------------------------------------------------

__device__ inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// r [row] = (mean(X_row²) + eps)^-½ over the row's K = hc·d values. One block per row.
__global__ void __launch_bounds__(kThreads) inv_rms_kernel(const float* X, int64_t K, float eps, float* r) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  float ss = 0;
  for (int64_t k = threadIdx.x; k < K; k += kThreads) ss += X[row * K + k] * X[row * K + k];
  const float total = block_sum<kThreads>(ss, scratch);
  if (threadIdx.x == 0) r[row] = 1.0f / sqrtf(total / float(K) + eps);
}

// comb's first iterate: the row softmax of m_{2hc..} s2 + b_{2hc..}, plus eps.
template <int HC>
__device__ void comb_softmax(const float* m, float s2, const float* base, float eps, float* c) {
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    float* row = c + i * HC;
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < HC; ++j) mx = fmaxf(mx, row[j] = m[2 * HC + i * HC + j] * s2 + base[2 * HC + i * HC + j]);
    float sum = 0;
#pragma unroll
    for (int j = 0; j < HC; ++j) sum += (row[j] = expf(row[j] - mx));
#pragma unroll
    for (int j = 0; j < HC; ++j) row[j] = row[j] / sum + eps;
  }
}

// Normalization t ≥ 1 of comb's chain, in place (its lines are disjoint): odd t each column, even t
// each row, x / (Σ + eps).
template <int HC>
__device__ void comb_normalize(float* c, int t, float eps) {
  const bool columns = t % 2 == 1;
#pragma unroll
  for (int a = 0; a < HC; ++a) {
    float sum = 0;
#pragma unroll
    for (int b = 0; b < HC; ++b) sum += c[columns ? b * HC + a : a * HC + b];
#pragma unroll
    for (int b = 0; b < HC; ++b) {
      float& x = c[columns ? b * HC + a : a * HC + b];
      x = x / (sum + eps);
    }
  }
}

// One thread per row: m = raw · r, then pre, post and comb.
template <int HC>
__global__ void sinkhorn_forward_kernel(const float* raw, const float* r, int64_t rows, const float* scale, const float* base,
                                        int iters, float eps, float* pre, float* post, float* comb) {
  constexpr int kMix = (2 + HC) * HC;
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  float m[kMix];
#pragma unroll
  for (int k = 0; k < kMix; ++k) m[k] = raw[row * kMix + k] * r[row];
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    pre[row * HC + j] = sigmoid(m[j] * scale[0] + base[j]) + eps;
    post[row * HC + j] = 2.0f * sigmoid(m[HC + j] * scale[1] + base[HC + j]);
  }
  float c[HC * HC];
  comb_softmax<HC>(m, scale[2], base, eps, c);
  for (int t = 1; t < 2 * iters; ++t) comb_normalize<HC>(c, t, eps);
#pragma unroll
  for (int e = 0; e < HC * HC; ++e) comb[row * HC * HC + e] = c[e];
}

// One thread per row: dm from dpre, dpost and dcomb through the chain (its iterates 0 .. 2·iters − 2
// recomputed into tape [iterate, entry, row]); then draw = dm · r [rows, kMix] for the product's
// backward, coef [row] = (Σ dm ⊙ raw) r³ / K for the inverse RMS's, and the row's parts of dscale
// and dbase in parts [3 + kMix, rows].
template <int HC>
__global__ void sinkhorn_backward_kernel(const float* raw, const float* r, int64_t rows, int64_t K, const float* scale,
                                         const float* base, int iters, float eps, const float* dpre, const float* dpost,
                                         const float* dcomb, float* tape, float* draw, float* coef, float* parts) {
  constexpr int kMix = (2 + HC) * HC, kN = HC * HC;
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float inv = r[row];
  float m[kMix], dm[kMix], dbase[kMix];
#pragma unroll
  for (int k = 0; k < kMix; ++k) m[k] = raw[row * kMix + k] * inv, dm[k] = 0;
  float ds[3] = {0, 0, 0};
#pragma unroll
  for (int j = 0; j < HC; ++j) {
    const float sp = sigmoid(m[j] * scale[0] + base[j]), sq = sigmoid(m[HC + j] * scale[1] + base[HC + j]);
    const float da = dpre[row * HC + j] * sp * (1.0f - sp), db = dpost[row * HC + j] * 2.0f * sq * (1.0f - sq);
    dm[j] += da * scale[0];
    ds[0] += da * m[j];
    dbase[j] = da;
    dm[HC + j] += db * scale[1];
    ds[1] += db * m[HC + j];
    dbase[HC + j] = db;
  }
  auto at = [&](int t, int e) { return (int64_t(t) * kN + e) * rows + row; };
  float c[kN];
  comb_softmax<HC>(m, scale[2], base, eps, c);
  for (int t = 0; t < 2 * iters - 1; ++t) {
    if (t > 0) comb_normalize<HC>(c, t, eps);
#pragma unroll
    for (int e = 0; e < kN; ++e) tape[at(t, e)] = c[e];
  }
  // Back through normalizations 2·iters − 1 .. 1: a line's y_b = c_b / S has dc_b = dy_b / S − Σ dy c / S².
  float dy[kN];
#pragma unroll
  for (int e = 0; e < kN; ++e) dy[e] = dcomb[row * kN + e];
  for (int t = 2 * iters - 1; t >= 1; --t) {
#pragma unroll
    for (int e = 0; e < kN; ++e) c[e] = tape[at(t - 1, e)];
    const bool columns = t % 2 == 1;
#pragma unroll
    for (int a = 0; a < HC; ++a) {
      float sum = 0, dot = 0;
#pragma unroll
      for (int b = 0; b < HC; ++b) {
        const int e = columns ? b * HC + a : a * HC + b;
        sum += c[e];
        dot += dy[e] * c[e];
      }
      const float S = sum + eps;
#pragma unroll
      for (int b = 0; b < HC; ++b) {
        const int e = columns ? b * HC + a : a * HC + b;
        dy[e] = dy[e] / S - dot / (S * S);
      }
    }
  }
  // Through the row softmax (its + eps passes the gradient unchanged): p = iterate 0 − eps.
#pragma unroll
  for (int e = 0; e < kN; ++e) c[e] = tape[at(0, e)] - eps;
#pragma unroll
  for (int i = 0; i < HC; ++i) {
    float dot = 0;
#pragma unroll
    for (int j = 0; j < HC; ++j) dot += c[i * HC + j] * dy[i * HC + j];
#pragma unroll
    for (int j = 0; j < HC; ++j) {
      const int k = 2 * HC + i * HC + j;
      const float dz = c[i * HC + j] * (dy[i * HC + j] - dot);
      dm[k] += dz * scale[2];
      ds[2] += dz * m[k];
      dbase[k] = dz;
    }
  }
  float dr = 0;
#pragma unroll
  for (int k = 0; k < kMix; ++k) {
    draw[row * kMix + k] = dm[k] * inv;
    dr += dm[k] * raw[row * kMix + k];
  }
  coef[row] = dr * inv * inv * inv / float(K);
#pragma unroll
  for (int s = 0; s < 3; ++s) parts[s * rows + row] = ds[s];
#pragma unroll
  for (int k = 0; k < kMix; ++k) parts[(3 + k) * rows + row] = dbase[k];
}

// dX [row, k] −= coef [row] · X [row, k]: the inverse RMS's part of the gradient.
__global__ void inv_rms_backward_kernel(const float* X, int64_t rows, int64_t K, const float* coef, float* dX) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * K) return;
  dX[e] -= coef[e / K] * X[e];
}

// out [col] += Σ_rows parts [col, rows]; one block per column (0 .. 2 of dscale, then dbase's).
__global__ void __launch_bounds__(kThreads) column_sum_kernel(const float* parts, int64_t rows, float* dscale, float* dbase) {
  __shared__ float scratch[kThreads / 32];
  const int64_t col = blockIdx.x;
  float sum = 0;
  for (int64_t row = threadIdx.x; row < rows; row += kThreads) sum += parts[col * rows + row];
  const float total = block_sum<kThreads>(sum, scratch);
  if (threadIdx.x == 0) {
    float& out = col < 3 ? dscale[col] : dbase[col - 3];
    out += total;
  }
}

// Calls launch.template operator()<HC>() for the run-time hc.
template <typename Launch>
void with_hc(int hc, const char* where, Launch launch) {
  switch (hc) {
    case 1: return launch.template operator()<1>();
    case 2: return launch.template operator()<2>();
    case 4: return launch.template operator()<4>();
    case 8: return launch.template operator()<8>();
    default: fail(where, "hc of 1, 2, 4 or 8", std::to_string(hc));
  }
}

unsigned elementwise_blocks(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

}  // namespace

void hc_mixes_forward(Blas& blas, const float* X, int64_t rows, int64_t d, const float* fn, const float* base, const float* scale,
                      const HcMixOptions& o, float* pre, float* post, float* comb, float* raw, float* r, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  if (o.sinkhorn_iters < 1) fail("train_cuda::hc_mixes_forward", "at least one Sinkhorn iteration", std::to_string(o.sinkhorn_iters));
  const int64_t K = o.hc * d, n_mix = (2 + o.hc) * o.hc;
  linear_forward(blas, Operands::Fp32, X, rows, K, fn, n_mix, raw, stream);
  inv_rms_kernel<<<unsigned(rows), kThreads, 0, stream>>>(X, K, o.norm_eps, r);
  cuda::check_launch("train_cuda::hc_mixes_forward");
  with_hc(o.hc, "train_cuda::hc_mixes_forward", [&]<int HC>() {
    sinkhorn_forward_kernel<HC><<<elementwise_blocks(rows), kThreads, 0, stream>>>(raw, r, rows, scale, base, o.sinkhorn_iters,
                                                                                   o.hc_eps, pre, post, comb);
  });
  cuda::check_launch("train_cuda::hc_mixes_forward");
}

void hc_mixes_backward(Blas& blas, const float* X, int64_t rows, int64_t d, const float* fn, const float* base,
                       const float* scale, const HcMixOptions& o, const float* raw, const float* r, const float* dpre,
                       const float* dpost, const float* dcomb, float* dX, float* dfn, float* dbase, float* dscale,
                       cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  if (o.sinkhorn_iters < 1) fail("train_cuda::hc_mixes_backward", "at least one Sinkhorn iteration", std::to_string(o.sinkhorn_iters));
  const int64_t K = o.hc * d, n_mix = (2 + o.hc) * o.hc;
  cuda::DeviceBuffer<float> tape = cuda::scratch<float>((2 * o.sinkhorn_iters - 1) * o.hc * o.hc * rows, stream);
  cuda::DeviceBuffer<float> draw = cuda::scratch<float>(rows * n_mix, stream), coef = cuda::scratch<float>(rows, stream);
  cuda::DeviceBuffer<float> parts = cuda::scratch<float>((3 + n_mix) * rows, stream);
  with_hc(o.hc, "train_cuda::hc_mixes_backward", [&]<int HC>() {
    sinkhorn_backward_kernel<HC><<<elementwise_blocks(rows), kThreads, 0, stream>>>(
        raw, r, rows, K, scale, base, o.sinkhorn_iters, o.hc_eps, dpre, dpost, dcomb, tape.get(), draw.get(), coef.get(),
        parts.get());
  });
  cuda::check_launch("train_cuda::hc_mixes_backward");
  inv_rms_backward_kernel<<<elementwise_blocks(rows * K), kThreads, 0, stream>>>(X, rows, K, coef.get(), dX);
  cuda::check_launch("train_cuda::hc_mixes_backward");
  linear_backward(blas, Operands::Fp32, X, rows, K, fn, n_mix, draw.get(), dX, dfn, stream);
  column_sum_kernel<<<unsigned(3 + n_mix), kThreads, 0, stream>>>(parts.get(), rows, dscale, dbase);
  cuda::check_launch("train_cuda::hc_mixes_backward");
}

void hc_pre_forward(const float* X, const float* pre, int64_t rows, int hc, int64_t d, float* y, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  with_hc(hc, "train_cuda::hc_pre_forward", [&]<int HC>() {
    pre_forward_kernel<HC><<<elementwise_blocks(rows * d), kThreads, 0, stream>>>(X, pre, rows, d, y);
  });
  cuda::check_launch("train_cuda::hc_pre_forward");
}

void hc_pre_backward(const float* X, const float* pre, int64_t rows, int hc, int64_t d, const float* dy, float* dX, float* dpre,
                     cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  with_hc(hc, "train_cuda::hc_pre_backward", [&]<int HC>() {
    pre_backward_kernel<HC><<<unsigned(rows), kThreads, 0, stream>>>(X, pre, d, dy, dX, dpre);
  });
  cuda::check_launch("train_cuda::hc_pre_backward");
}

void hc_post_forward(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
                     float* out, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  with_hc(hc, "train_cuda::hc_post_forward", [&]<int HC>() {
    post_forward_kernel<HC><<<elementwise_blocks(rows * d), kThreads, 0, stream>>>(f, X, post, comb, rows, d, out);
  });
  cuda::check_launch("train_cuda::hc_post_forward");
}

void hc_post_backward(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
                      const float* dout, float* df, float* dX, float* dpost, float* dcomb, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  with_hc(hc, "train_cuda::hc_post_backward", [&]<int HC>() {
    post_backward_kernel<HC><<<unsigned(rows), kThreads, 0, stream>>>(f, X, post, comb, d, dout, df, dX, dpost, dcomb);
  });
  cuda::check_launch("train_cuda::hc_post_backward");
}

void hc_expand_forward(const float* x, int64_t rows, int hc, int64_t d, float* X, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  with_hc(hc, "train_cuda::hc_expand_forward", [&]<int HC>() {
    expand_forward_kernel<HC><<<elementwise_blocks(rows * d), kThreads, 0, stream>>>(x, rows, d, X);
  });
  cuda::check_launch("train_cuda::hc_expand_forward");
}

void hc_expand_backward(const float* dX, int64_t rows, int hc, int64_t d, float* dx, cudaStream_t stream) {
  if (rows <= 0 || d <= 0) return;
  with_hc(hc, "train_cuda::hc_expand_backward", [&]<int HC>() {
    expand_backward_kernel<HC><<<elementwise_blocks(rows * d), kThreads, 0, stream>>>(dX, rows, d, dx);
  });
  cuda::check_launch("train_cuda::hc_expand_backward");
}

}  // namespace dsv41::train_cuda
