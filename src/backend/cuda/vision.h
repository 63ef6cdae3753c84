#pragma once
// The vision tower's ops on the GPU (docs/vision.md §5-§6), each as its CPU op
// (backend/cpu/vision.h, vision_rope.h, pixel_unshuffle.h) over a call's images' rows one after
// another; the per-image structure (grid places, unshuffle sources, row ranges) comes in as tables
// made on the host (forward/vision_layout.h). Activations are fp32 storage of bf16 values, device
// pointers throughout.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda {

// y[M, N] = bf16(x · Wᵀ + b), as dsv41::linear_bias: cuda::linear_f32 (the tensor-core GEMM from
// 2 rows; x must hold bf16 values and W.cols be a multiple of 8), then the bias (a BF16 or F32
// device Weight of N values, or null) added in fp32 and one rounding.
void linear_bias(const float* x, int64_t M, const Weight& w, const Weight* bias, float* y, cudaStream_t stream = nullptr);

// x[i] = bf16(x[i] + y[i]), n values.
void add_bf16(float* x, const float* y, int64_t n, cudaStream_t stream = nullptr);

// out[M, inter] = bf16(bf16(silu(gate)) · up) of gu [M, 2·inter] = [gate | up] per row.
void silu_mul(const float* gu, int64_t M, int64_t inter, float* out, cudaStream_t stream = nullptr);

// x = bf16(gelu(x)), the exact (erf) GELU, n values.
void gelu(float* x, int64_t n, cudaStream_t stream = nullptr);

// The 2D RoPE (VisionRope::apply) on the q and k thirds of every row of qkv [rows, 3·heads·head_dim]:
// row r at its patch's place places[2r] (grid row), places[2r + 1] (grid column); freqs the
// head_dim/4 frequencies (VisionRope::frequencies()). head_dim a multiple of 4.
void vision_rope(float* qkv, int64_t rows, int heads, int head_dim, const int32_t* places, const float* freqs,
                 cudaStream_t stream = nullptr);

// Full bidirectional attention over one image's n patches (dsv41::vision_attention): qkv [n,
// 3·heads·head_dim] (q and k rotated), o [n, heads·head_dim] = softmax(q·kᵀ/√head_dim)·v per head,
// rounded to bf16. head_dim ≤ 64 (the released tower's 64, the fixture's 16).
void vision_attention(const float* qkv, int64_t n, int heads, int head_dim, float* o, cudaStream_t stream = nullptr);

// The pixel unshuffle of every image at once as a gather (pixel_unshuffle's result):
// out[t][c·r² + q] = x[sources[t·r² + q]][c], or 0 where the source is -1; x [patches, dim],
// out [tokens, dim·r²], sources [tokens, r²] (VisionLayout::unshuffle).
void pixel_unshuffle(const float* x, int64_t dim, const int32_t* sources, int64_t tokens, int r, float* out,
                     cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
