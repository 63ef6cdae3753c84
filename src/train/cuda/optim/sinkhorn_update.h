#pragma once
// The Sinkhorn-balanced update on the device: src/train/optim/sinkhorn_update.h's step (the
// embedding, the head, the Engram tables; the Engram rate ×5 is the group's multiplier, applied by
// the caller as on the CPU: optimizer.h).
//
//   momentum ← Nesterov (nesterov.h: the CPU's bits)
//   ρᵢ = ‖Ĝᵢ‖, rows with ρᵢ ≤ τ ρ̄ masked; K alternating row and column normalisations of D_r Ĝ D_c
//   W ← W − γ η √n D_r Ĝ D_c
//
// Ĝ is not stored: every pass recomputes it from the momentum and the gradient (nesterov.cuh, the
// same bits), so a [vocab, dim] table needs no third array of its size. The scales D_r, D_c are in
// double as on the CPU. The column sums run over the rows in fixed chunks (partials added in chunk
// order), the row sums over the columns in a fixed tree: not the CPU's orders, so the scales differ
// from its by a few units of double rounding, and U rounded to float is the CPU's or one float
// unit away from it (docs/training.md, "The CUDA optimizers").
#include <cuda_runtime_api.h>

#include <cstdint>

#include "train/optim/sinkhorn_update.h"

namespace dsv41::train_cuda::optim {

// One step of W [rows, cols] with gradient grad and the momentum state, device arrays. Scratch
// (the scales and the column partials: 8 (2 rows + cols (1 + rows / 512)) bytes) from the stream's
// pool. Throws as the CPU's for an even step count or an empty matrix, before touching anything.
void sinkhorn_step(float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, float lr,
                   const dsv41::optim::SinkhornOptions& options, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda::optim
