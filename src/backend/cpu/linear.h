#pragma once
// Matrix products against checkpoint weights, with the reference's precision (model.py `linear`).
#include <cstdint>

#include "model/weight.h"

namespace dsv41 {

// y[M, N] = x[M, K] · Wᵀ, W = [N, K], as model.py's linear() computes it:
//  * fp8 / fp4 weights: x is quantized to e4m3 per 32 along K with a power-of-two scale (act_quant),
//    each 32-wide K block is multiplied in fp32, and the block partials, times the weight block
//    scale, are added in K order into an fp32 accumulator (kernel.py fp8_gemm / fp4_gemm);
//  * bf16 / fp32 weights: an fp32 product (gemm_f32, in its fixed order), as torch's bf16 GEMM
//    accumulates in fp32.
// The output is rounded to bf16, the activations' dtype. x must hold bf16 values.
void linear(const float* x, int64_t M, const Weight& w, float* y);

// linear()'s fp32 sums before their rounding to bf16: a rank's part of a row-parallel product
// (model/partition.h), its K a slice of the whole at a multiple of 32, so that act_quant's blocks
// are the whole product's; the ranks' parts added and then rounded are linear() of the whole, its
// terms summed in another order.
void linear_unrounded(const float* x, int64_t M, const Weight& w, float* y);

// y[M, N] = x[M, K] · Wᵀ in fp32 with no rounding (F.linear on fp32 tensors): the compressor at
// ratio > 1, the MoE gate, the LM head, mHC's hc_fn.
void linear_f32(const float* x, int64_t M, const Weight& w, float* y);

// For parity tests: runs every product from now on in another correct summation order, so that a
// test can measure how far two correct orders' results spread (the reference's is one more).
// 0 (the default) is the documented order; variant v > 0 sums each fp32 product with K rotated
// by 17·v and each quantized product with every 32-element block rotated by 9·v — the same
// products, their terms added in another sequence. Not for concurrent use with a forward.
void set_summation_variant(int v);

}  // namespace dsv41
