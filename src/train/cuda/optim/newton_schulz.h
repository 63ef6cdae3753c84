#pragma once
// The hybrid Newton–Schulz orthogonalisation on the device: src/train/optim/newton_schulz.h's
// iteration (its coefficient table kHybridNewtonSchulz and ε are used, not copied), on cuBLASLt
// products (train_cuda::Blas, linear.h), for a batch of equal blocks at once (head-wise Muon's heads).
//
// Per block U [rows, cols]: X₀ = U / (‖U‖_F + 1e-7) (the sum of squares in double, as the CPU), then
// X ← a X + (b A + c A²) X, A = X Xᵀ, through the table's stages. Each iteration is three products
// whose epilogues do the linear combinations:
//
//   A = X Xᵀ,   B = c · A Aᵀ + b · A,   X' = B X + a · X
//
// A Aᵀ is A² (A is symmetric), written as the CPU writes it. When rows > cols the iteration runs on
// Z = Xᵀ in U's own layout instead of a transposed copy: A = Zᵀ Z, Z' = Z Bᵀ + a · Z (the transpose
// of the same iterate), so the Gram matrix is the smaller one, as on the CPU.
//
// Precision: X, A and B are fp32 throughout; the products' operands are those fp32 values
// (NsPrecision::Fp32: the CPU's arithmetic up to the sums' order and the epilogue's single rounding)
// or bf16 copies of them (NsPrecision::Bf16: the tensor cores; each product's operands rounded,
// accumulation and the combinations with a X and b A still fp32). docs/training.md ("The CUDA
// optimizers") bounds both against the CPU and says when to use which.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "train/cuda/linear.h"

namespace dsv41::train_cuda::optim {

enum class NsPrecision { Fp32, Bf16 };

// X [blocks, rows, cols] (device, each block row-major and contiguous): in, the matrices U; out,
// each one's approximation of its polar factor, in place. Scratch from the stream's pool.
void orthogonalize(Blas& blas, float* X, int64_t blocks, int64_t rows, int64_t cols, NsPrecision precision,
                   cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda::optim
