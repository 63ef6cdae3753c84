#pragma once
// The prefill GEMM of cuda::linear, linear_f32 and linear_grouped over bf16 weights (gemm_bf16.cu):
// bf16 mma.sync, or from kWgRows rows the warpgroup MMA, with fp32 accumulation. Internal to the CUDA backend; linear.cu calls it for
// M ≥ kMinRows.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda::gemm_bf16 {

// The fewest activation rows for which the products take this GEMM (below it, the gemv). The gemv
// reads the weight once per 8 rows; from 2 rows the GEMM's one pass (its 128-row tile mostly
// padding at decode) is as fast or faster (docs/benchmarks.md, "Small batches on the tensor cores").
inline constexpr int64_t kMinRows = 2;
// From this many rows (prefill) with K a multiple of 64, the warpgroup form (wgmma, the tensor copy
// engine); below it mma.sync, whose tiles and split-K at decode sizes depend on the weight alone.
inline constexpr int64_t kWgRows = 256;

// Whether a product over w at M rows runs here: a bf16 weight, M ≥ kMinRows, K a multiple of 8
// (whole 16-byte chunks), and every offset within 32 bits.
bool usable(int64_t M, const Weight& w, int64_t groups = 1);

// y[M, N] = x · Wᵀ for W [N, K] in `groups` groups of r = N / groups rows, as linear_grouped: x is
// [M, groups·K] and group g's rows W[g·r .. (g + 1)·r) multiply x[m, g·K .. (g + 1)·K) into
// y[m, g·r .. (g + 1)·r); groups = 1 is a plain product. x holds bf16 values (fp32 storage); round:
// y to bf16 (linear) or not (linear_f32). Scratch (x as bf16, M·groups·K·2 bytes) from
// cudaMallocAsync on `stream`.
void linear(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, bool round, cudaStream_t stream);

// The same product over w stored as e4m3 codes with 32 × 32 block scales and multiplied as their
// bf16 values (code · scale, exact), at any M ≥ 1, reading the codes (half the bytes of the bf16
// weight): up to kSwapRows rows the swapped form (the weight's rows the MMA's rows, x's its
// columns; its sums in another order than linear()'s); above, the mma.sync form widening the codes
// as it loads them, the same bits as linear() over the bf16 weight; from kWgRows the bf16 values
// once into scratch, then linear(). Groups of whole 32-row blocks, K a multiple of 64 (usable_fp8).
inline constexpr int64_t kSwapRows = 8;
bool usable_fp8(const Weight& w, int64_t groups);
void linear_fp8(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, bool round, cudaStream_t stream);

}  // namespace dsv41::cuda::gemm_bf16
