#pragma once
// The hybrid Newton–Schulz orthogonalisation of Muon as DeepSeek-V4 runs it (V4 report,
// Algorithm 1; V4.1 keeps V4's optimizer configuration, report §2.5; components.md §4.3).
//
// From X₀ = U / (‖U‖_F + 1e-7), each iteration is X ← a X + (b A + c A²) X with A = X Xᵀ: it maps
// every singular value σ of X to a σ + b σ³ + c σ⁵ and keeps the singular vectors, so X tends to
// the orthogonal polar factor of U (its SVD's P Qᵀ). Ten iterations in two stages:
//
//   8 × (3.4445, −4.7750, 2.0315)   Keller Jordan's quintic: slope 3.4 at 0, so small singular
//                                    values grow fast; it leaves those ≥ 3e-4 in [0.68, 1.14],
//                                    not at 1
//   2 × (2, −1.5, 0.5)              a quintic with p(1) = 1, p'(1) = 0: it pulls them to 1
//
// In exact arithmetic every σ/‖U‖_F ≥ 1e-3 ends in [1, 1.00054] and every one ≥ 1e-4 in
// [1, 1.0021] (docs/training.md, "Muon"); below ~2.5e-5 the ten iterations do not reach 1.
#include <cstdint>

namespace dsv41::optim {

struct NewtonSchulzStage {
  float a, b, c;
  int iterations;
};
inline constexpr NewtonSchulzStage kHybridNewtonSchulz[] = {{3.4445f, -4.7750f, 2.0315f, 8}, {2.0f, -1.5f, 0.5f, 2}};
// Added to ‖U‖_F before the division (Keller Jordan's Muon): a zero U stays zero.
inline constexpr double kNewtonSchulzEps = 1e-7;

// out [rows, cols] ← the hybrid iteration's approximation of U's polar factor (U [rows, cols]).
// It runs on Uᵀ when rows > cols, so that A = X Xᵀ is the smaller Gram matrix; the result is the
// same map of the singular values either way. The products are backend/cpu's gemm_f32 (one
// summation order on every CPU), so the result is the same bits on every machine.
void orthogonalize(const float* U, int64_t rows, int64_t cols, float* out);

}  // namespace dsv41::optim
