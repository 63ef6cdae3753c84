#pragma once
// mHC's stream mixes of the CUDA trainer, the mirror of src/train/grad/mhc.h's hc_pre, hc_post and
// hc_expand (fp32; the residual is hc streams X [rows, hc, d]; pre, post [rows, hc], comb
// [rows, hc, hc] as hc_mixes gives them):
//
//   hc_pre:    y = Σ_i pre_i X_i          dX_i += pre_i dy;  dpre_i += dy · X_i
//   hc_post:   X'_j = post_j f + Σ_i comb_ij X_i
//              df += Σ_j post_j dX'_j;  dpost_j += dX'_j · f;  dcomb_ij += dX'_j · X_i;
//              dX_i += Σ_j comb_ij dX'_j
//   hc_expand: X_i = x for every stream;  dx += Σ_i dX_i
//
// hc is 1, 2, 4 or 8 (a template constant inside). Device pointers; backwards add.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

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
