#pragma once
// AdamW (Loshchilov & Hutter) for the norms' weights and the other non-matrix parameters (report
// §2.5, §4.2.2: β₁ = 0.9, β₂ = 0.95, ε = 1e-20, weight decay 0.1 on the norms' weights, none on
// biases and scaling factors). Step t (1-based) of a tensor w with gradient g, learning rate η:
//
//   m ← β₁ m + (1 − β₁) g,   v ← β₂ v + (1 − β₂) g²
//   w ← w (1 − η λ) − (η / (1 − β₁ᵗ)) · m / (√v / √(1 − β₂ᵗ) + ε)
//
// torch.optim.AdamW's formula and order of operations. With ε = 1e-20 the first step moves every
// coordinate with a non-zero gradient by η sign(g) (plus the decay).
#include <cstdint>

namespace dsv41::optim {

struct AdamWOptions {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-20f;
  float weight_decay = 0.1f;  // λ; the parameter table says which tensors take it
};

// w, grad, m, v [n]; m and v are the state (zero at the start); step ≥ 1 counts this update.
void adamw_step(float* w, const float* grad, float* m, float* v, int64_t n, int64_t step, float lr,
                const AdamWOptions& options);

}  // namespace dsv41::optim
