#pragma once
// mHC on the GPU, as backend/cpu/mhc.h, batched over rows (tokens).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda {

// As dsv41::hc_mixes: X [rows, hc, d]; w's tensors on the device, fn and base and scale F32; hc ≤ 4.
// pre [rows, hc], post [rows, hc], comb [rows, hc, hc]. All device pointers.
void hc_mixes(const float* X, int64_t rows, int hc, int64_t d, const HcWeights& w, float norm_eps, int sinkhorn_iters,
              float hc_eps, float* pre, float* post, float* comb, cudaStream_t stream = nullptr);

// As dsv41::hc_pre for each row: y [rows, d] from X [rows, hc, d] and pre [rows, hc].
void hc_pre(const float* X, const float* pre, int64_t rows, int hc, int64_t d, float* y, cudaStream_t stream = nullptr);

// As dsv41::hc_post for each row: out [rows, hc, d] from f [rows, d], X [rows, hc, d], post [rows, hc]
// and comb [rows, hc, hc]. out must not alias X.
void hc_post(const float* f, const float* X, const float* post, const float* comb, int64_t rows, int hc, int64_t d,
             float* out, cudaStream_t stream = nullptr);

// Mega-mHC: one sub-layer boundary of the forward (forward.cpp: write_back, then the next
// sub-layer's hc_mixes, hc_pre and rms_norm) as one kernel, for each of `rows` tokens:
//   Xo = hc_post(f, X, post, comb)                          the residual update
//   (pre_out, post_out, comb_out) = hc_mixes(Xo, w, ...)    the next coefficients
//   h = rms_norm(hc_pre(Xo, pre_in), norm, eps)             the next sub-layer's input, mixed with
//                                                           the previous coefficients `pre_in`
// eps is both hc_mixes' norm_eps and rms_norm's, as in the forward. Xo must not alias X. The
// residual is read once and written once: (2·hc + 2)·d floats per token (X, Xo, f, h), plus hc_fn
// ((2 + hc)·hc·hc·d floats, shared by the rows). Calls on different streams must not overlap
// (the blocks of a row meet at a per-row arrival counter in device memory).
void mega_mhc(const float* f, const float* X, const float* post, const float* comb, const float* pre_in, int64_t rows,
              int hc, int64_t d, const HcWeights& w, const Weight* norm, float eps, int sinkhorn_iters, float hc_eps,
              float* Xo, float* h, float* pre_out, float* post_out, float* comb_out, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
