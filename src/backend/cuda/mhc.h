#pragma once
// mHC on the GPU, as backend/cpu/mhc.h, batched over rows (tokens).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cpu/mhc.h"

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

}  // namespace dsv41::cuda
