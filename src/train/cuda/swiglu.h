#pragma once
// The clamped SwiGLU activation of an expert, the mirror of the elementwise part of
// src/train/grad/swiglu_expert.h (its three products are linear.h's). With g = W1 x, u = W3 x
// [rows, inter], L = limit (L ≤ 0: no clamps) and w the row's routing weight (1 when none):
//
//   h = w · silu(min(g, L)) · clamp(u, −L, L)
//   du = dh · w · silu(g')              (0 where u is outside [−L, L])
//   dg = dh · w · u' · silu'(g')        (0 where g > L),  silu'(z) = σ(z)(1 + z(1 − σ(z)))
//   dw += Σ_i dh_i · silu(g'_i) · u'_i
//
// (g', u' the clamped values). fp32 throughout; device pointers, row-major [rows, inter].
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// row_weights [rows] or nullptr. Writes hidden.
void swiglu_forward(const float* gate, const float* up, int64_t rows, int64_t inter, float limit, const float* row_weights,
                    float* hidden, cudaStream_t stream = nullptr);

// gate, up: the forward's inputs (before the clamps); dh: the gradient of hidden. Writes dgate and
// dup (the gradients of W1 x and W3 x, fresh tensors); adds into drow_weights [rows] unless nullptr
// (a deterministic per-row sum: one block per row, a fixed tree).
void swiglu_backward(const float* gate, const float* up, int64_t rows, int64_t inter, float limit,
                     const float* row_weights, const float* dh, float* dgate, float* dup, float* drow_weights,
                     cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
