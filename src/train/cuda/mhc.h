#pragma once
// mHC of the CUDA trainer, the mirror of src/train/grad/mhc.h (its hc_mixes with sinkhorn.h's
// split, hc_pre, hc_post and hc_expand; fp32; the residual is hc streams X [rows, hc, d]; pre, post
// [rows, hc], comb [rows, hc, hc]):
//
//   hc_mixes:  raw = fn · vec X,  m = raw · r,  r = (mean(vec X²) + norm_eps)^-½, then
//              pre_j = σ(m_j s0 + b_j) + hc_eps,  post_j = 2 σ(m_{hc+j} s1 + b_{hc+j}),
//              comb = rowsoftmax(m_{2hc..} s2 + b_{2hc..}) + hc_eps, then 2·iters − 1
//              normalizations, columns first and alternating, each x / (Σ + hc_eps)
//   hc_pre:    y = Σ_i pre_i X_i          dX_i += pre_i dy;  dpre_i += dy · X_i
//   hc_post:   X'_j = post_j f + Σ_i comb_ij X_i
//              df += Σ_j post_j dX'_j;  dpost_j += dX'_j · f;  dcomb_ij += dX'_j · X_i;
//              dX_i += Σ_j comb_ij dX'_j
//   hc_expand: X_i = x for every stream;  dx += Σ_i dX_i
//
// hc_mixes' backward runs through every normalization as the forward ran it (sinkhorn.h: not through
// the fixed point), recomputing the iterates from the saved raw and r; fn · vec X and its backward
// are linear.h's fp32 products (the (2 + hc)·hc mixes a row feed a normalization that bf16 operands
// would move far past the CPU's rounding). hc is 1, 2, 4 or 8 (a template constant inside). Device
// pointers; backwards add.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "train/cuda/linear.h"

namespace dsv41::train_cuda {

struct HcMixOptions {
  int hc = 4;
  int sinkhorn_iters = 20;
  float norm_eps = 1e-20f;
  float hc_eps = 1e-6f;
};

// X [rows, hc, d]; fn [(2 + hc) hc, hc d], base [(2 + hc) hc], scale [3]. Writes pre, post [rows, hc]
// and comb [rows, hc, hc] (comb[i][j] weighs stream i into j), and what the backward reads:
// raw [rows, (2 + hc) hc] and r [rows].
void hc_mixes_forward(Blas& blas, const float* X, int64_t rows, int64_t d, const float* fn, const float* base, const float* scale,
                      const HcMixOptions& o, float* pre, float* post, float* comb, float* raw, float* r,
                      cudaStream_t stream = nullptr);

// Adds into dX [rows, hc, d], dfn, dbase and dscale. dbase's and dscale's sums over the rows are
// deterministic: each row's part written, the parts summed in a fixed tree (no atomics).
void hc_mixes_backward(Blas& blas, const float* X, int64_t rows, int64_t d, const float* fn, const float* base,
                       const float* scale, const HcMixOptions& o, const float* raw, const float* r, const float* dpre,
                       const float* dpost, const float* dcomb, float* dX, float* dfn, float* dbase, float* dscale,
                       cudaStream_t stream = nullptr);

// y [rows, d] (written).
void hc_pre_forward(const float* X, const float* pre, int64_t rows, int hc, int64_t d, float* y, cudaStream_t stream = nullptr);
void hc_pre_backward(const float* X, const float* pre, int64_t rows, int hc, int64_t d, const float* dy, float* dX, float* dpre,
                     cudaStream_t stream = nullptr);

// f [rows, d]; out [rows, hc, d] (written; must not be X).
void hc_post_forward(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
                     float* out, cudaStream_t stream = nullptr);
void hc_post_backward(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
                      const float* dout, float* df, float* dX, float* dpost, float* dcomb, cudaStream_t stream = nullptr);

// X [rows, hc, d] (written): hc copies of x [rows, d].
void hc_expand_forward(const float* x, int64_t rows, int hc, int64_t d, float* X, cudaStream_t stream = nullptr);
void hc_expand_backward(const float* dX, int64_t rows, int hc, int64_t d, float* dx, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
