// mHC's stream mixes (mhc.h). Every value that is a sum over the streams (hc terms) is formed by
// one thread in the CPU loop's order, so y, X', dX, df and dx are the CPU's bits; the sums over a
// row's d channels (dpre, dpost, dcomb) are block trees. Traffic, per row of d channels and hc
// streams, 4 bytes a value: hc_pre forward (hc + 1)·d read/written, backward 3hc·d + d; hc_post
// forward 2hc·d + d, backward 4hc·d + 3d; hc_expand (hc + 1)·d either way.
#include "train/cuda/mhc.h"

#include <string>

#include "backend/cuda/check.h"
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
