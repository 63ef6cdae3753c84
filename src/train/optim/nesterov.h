#pragma once
// Nesterov momentum, shared by Muon and the Sinkhorn-balanced update (report §2.5: both use it,
// with the same coefficient μ = 0.95). Per element, with the gradient g:
//
//   m ← μ m + (1 − μ) g          (the buffer kept between steps)
//   Ĝ = μ m + (1 − μ) g          (the look-ahead the orthogonalisation or balancing consumes)
//
// This is the form of DeepSeek's Engram-Sinkhorn momentum kernel (TileKernels) and of Keller
// Jordan's Muon. DeepSeek-V4's Algorithm 1 writes M ← μM + G, Ĝ = μM + G: that buffer is
// 1/(1 − μ) times this one and its Ĝ too, and both consumers divide the scale out (Newton–Schulz
// starts from Ĝ/‖Ĝ‖, Sinkhorn normalizes rows), so the two forms make the same update.
#include <cstdint>

namespace dsv41::optim {

// momentum [n] is updated; lookahead [n] receives Ĝ (may alias grad, not momentum).
inline void nesterov_momentum(const float* grad, float* momentum, int64_t n, float mu, float* lookahead) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    momentum[i] = mu * momentum[i] + (1 - mu) * g;
    lookahead[i] = mu * momentum[i] + (1 - mu) * g;
  }
}

}  // namespace dsv41::optim
