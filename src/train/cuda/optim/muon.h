#pragma once
// Muon on the device: src/train/optim/muon.h's step, with head-wise blocks as one batch.
//
//   Ĝ = Nesterov look-ahead of G (nesterov.h: the CPU's bits, the momentum too)
//   O_B = orthogonalize(Ĝ_B) · √max(rows_B, cols) · γ for each block B of rows (newton_schulz.h)
//   W ← W (1 − η λ) − η O     (the CPU's fp32 operations in its order)
//
// The only difference from the CPU is Newton–Schulz's (its products' summation order, or their
// bf16 operands): the momentum is the same bits, the update within the bound docs/training.md states.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "train/cuda/optim/newton_schulz.h"
#include "train/optim/muon.h"

namespace dsv41::train_cuda::optim {

// W, grad, momentum [rows, cols], device arrays; row_blocks divides rows: block h is rows
// [h·rows/row_blocks, (h+1)·rows/row_blocks). Scratch (Ĝ and Newton–Schulz's) from the stream's pool.
void muon_step(Blas& blas, float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, int64_t row_blocks,
               float lr, const dsv41::optim::MuonOptions& options, NsPrecision precision = NsPrecision::Fp32,
               cudaStream_t stream = nullptr);

// The step's last line, for an optimizer that runs Newton–Schulz over many matrices at once
// (optimizer.cpp): W [n] ← W (1 − η λ) − η O √max(block_rows, cols) γ, O the orthogonalized Ĝ.
void muon_apply(float* W, const float* O, int64_t n, int64_t block_rows, int64_t cols, float lr,
                const dsv41::optim::MuonOptions& options, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda::optim
