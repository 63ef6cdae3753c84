#pragma once
// The Sinkhorn-balanced update for the token embedding, the prediction head and the Engram tables
// (report §2.5, Algorithm 1; §4.2.2: K = 11, τ = 1e-3, ε = 1e-20, γ = 0.18, Nesterov μ = 0.95, no
// weight decay). It is Muon's workflow with Sinkhorn balancing in place of Newton–Schulz: the
// Nesterov look-ahead Ĝ [m, n] (rows: a token or an n-gram identity; columns: hidden features) is
// scaled as D_r Ĝ D_c until its rows and its columns have equal RMS, and
//
//   W ← W − γ η U,    U = √n · D_r Ĝ D_c
//
// The steps (docs/training.md, "The Sinkhorn-balanced update", says which are our reading):
//   ρᵢ = ‖Ĝᵢ‖₂; rows with ρᵢ ≤ τ ρ̄ (ρ̄ the mean of ρ over all m rows) are masked: D_r = 0 there
//   step 1, 3, …, K (odd): every row of D_r Ĝ D_c to ℓ₂ norm 1     rᵢ ← rᵢ / (‖rᵢ Ĝᵢ c‖ + ε)
//   step 2, 4, …, K − 1:   every column to ℓ₂ norm √(m′/n)         cⱼ ← cⱼ √(m′/n) / (‖r Ĝ_·ⱼ cⱼ‖ + ε)
//   with m′ the unmasked rows; then √n turns the last step's unit row norm into unit row RMS.
// The column target only sets the scale of D_c, which the next row step divides out; √(m′/n) is
// the norm a column has when all are equal and the rows have norm 1.
#include <cstdint>

namespace dsv41::optim {

struct SinkhornOptions {
  float momentum = 0.95f;
  int steps = 11;             // K, odd: the last step normalizes the rows
  float tau = 1e-3f;          // rows with ρᵢ ≤ τ ρ̄ are masked
  float eps = 1e-20f;
  float lr_correction = 0.18f;  // γ: the effective learning rate is γ η
};

// U [rows, cols] ← √cols · D_r G D_c for G [rows, cols] (U may not alias G). All-zero or fully
// masked G gives U = 0.
void sinkhorn_balance(const float* G, int64_t rows, int64_t cols, const SinkhornOptions& options, float* U);

// One step of W [rows, cols] with gradient grad and the momentum state (zero at the start).
void sinkhorn_step(float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, float lr,
                   const SinkhornOptions& options);

}  // namespace dsv41::optim
