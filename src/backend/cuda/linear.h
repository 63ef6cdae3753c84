#pragma once
// Matrix products against checkpoint weights on the GPU, with the CPU op's precision flow
// (backend/cpu/linear.h): the weight is read in its checkpoint format and dequantized inside the
// kernel; no bf16 or fp32 copy of it exists.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda {

// y[M, N] = x[M, K] · Wᵀ, as dsv41::linear: for fp8/fp4 weights x is quantized to e4m3 per 32 with
// a power-of-two scale, each 32-wide block is multiplied in fp32 and scaled by the weight block's
// scale, the blocks are added in fp32; bf16/fp32 weights give an fp32 product. y is rounded to
// bf16. x, y and w.data / w.scale are device pointers; x holds bf16 values.
void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream = nullptr);

// The same product in fp32 with no rounding of y (dsv41::linear_f32); float weights only. Over a
// bf16 weight at M ≥ 2 it runs on the tensor cores, whose products need x to hold bf16 values too
// (the compressor's and the head's inputs, normed rows, do).
void linear_f32(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream = nullptr);

// A grouped product (the attention's low-rank output wo_a): the weight's N rows form `groups`
// groups of N / groups rows, each with its own input: x [M, groups, K], y [M, N] with
// y[m, n] = x[m, n / (N / groups)] · W[n], each group exactly linear() of its input on its rows.
void linear_grouped(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, cudaStream_t stream = nullptr);
// linear_grouped over a weight the checkpoint stores as fp8 (32 × 32 block scales) and the model
// multiplies as its bf16 dequantization (wo_a: convert.py's), read as the codes, half the bytes,
// and widened to the same bf16 values as they load: at decode's few rows (gemm_bf16::linear_fp8's
// swapped form) the tensor cores with the weight's rows as the MMA's rows, then up to
// gemm_bf16::kWgRows the fp8 GEMM's warpgroup tiles over x's bf16 values (gemm::linear_groups),
// from there the bf16 weight's products and sums bit for bit (gemm_bf16's warpgroup form).
void linear_grouped_widened(const float* x, int64_t M, int64_t groups, const Weight& w, float* y,
                            cudaStream_t stream = nullptr);
// Whether linear_grouped_widened takes w in `groups` groups: fp8 with its scales, groups of whole
// 32-row blocks, K a multiple of 64.
bool widened_usable(const Weight& w, int64_t groups);

}  // namespace dsv41::cuda
