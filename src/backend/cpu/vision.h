#pragma once
// The ViT's and the aligner's ops besides RoPE and the unshuffle (vision.py; docs/vision.md §5-§6):
// torch's bf16 modules, each rounding its output to bf16 once.
#include <cstdint>

#include "model/weight.h"

namespace dsv41 {

// y[M, N] = bf16(x · Wᵀ + b), a bf16 nn.Linear: the fp32 product (gemm_f32's order), the bias
// [N] added in fp32, one rounding. `bias` may be null (mlp.w1, mlp.w2). x must hold bf16 values.
void linear_bias(const float* x, int64_t M, const Weight& w, const Weight* bias, float* y);

// x[i] = bf16(x[i] + y[i]): a residual addition of bf16 tensors.
void add_bf16(float* x, const float* y, int64_t n);

// MLP's gate: gu is [M, 2·inter] (w1's output), whose halves are gate and up;
// out[M, inter] = bf16(bf16(silu(gate)) · up), as F.silu then the product of bf16 tensors.
void silu_mul(const float* gu, int64_t M, int64_t inter, float* out);

// x = bf16(gelu(x)) in place, the exact GELU (F.gelu: x/2 · (1 + erf(x/√2))), fp32 inside.
void gelu(float* x, int64_t n);

// Full bidirectional attention over the n patches of one image (F.scaled_dot_product_attention, no
// mask): qkv [n, 3·heads·head_dim] rows (wqkv's output: q, k, v thirds, each `heads` heads of
// head_dim, q and k already rotated); o [n, heads·head_dim] = softmax(q·kᵀ / √head_dim)·v per head.
// Scores, softmax and the weighted sum in fp32; o rounded to bf16.
void vision_attention(const float* qkv, int64_t n, int heads, int head_dim, float* o);

}  // namespace dsv41
