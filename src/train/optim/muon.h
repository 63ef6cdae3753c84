#pragma once
// Muon for the weight matrices of linear maps (report §2.5 and §4.2.2; DeepSeek-V4's Algorithm 1,
// components.md §4.3), with head-wise Muon for the query and key projections. One step of a
// matrix W [rows, cols] with gradient G, learning rate η (the schedule's, times the group's
// multiplier):
//
//   Ĝ = Nesterov look-ahead of G (nesterov.h, μ = 0.95)
//   for each block B of rows (one block, or one per head: head-wise Muon):
//     O_B = orthogonalize(Ĝ_B) · √max(rows_B, cols) · γ        (γ = 0.18)
//   W ← W (1 − η λ) − η O                                      (decoupled weight decay, λ = 0.1)
//
// Why √max · γ gives RMS γ: an [r, c] matrix whose min(r, c) singular values are 1 has
// ‖O‖_F² = min(r, c), so its RMS is √(min / (r c)) = 1 / √max(r, c). The update's RMS is then γ
// up to the Newton–Schulz band (newton_schulz.h), for a Ĝ of full rank; a Ĝ of rank k < min(r, c)
// gives γ √(k / min(r, c)). The report rescales "the RMS of each update matrix to 0.18 for
// reutilization of the AdamW learning rate".
#include <cstdint>

namespace dsv41::optim {

struct MuonOptions {
  float momentum = 0.95f;
  float weight_decay = 0.1f;
  float update_rms = 0.18f;  // γ
};

// W, grad, momentum [rows, cols]; momentum is the state kept between steps (zero at the start).
// row_blocks divides rows: block h is rows [h·rows/row_blocks, (h+1)·rows/row_blocks).
void muon_step(float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, int64_t row_blocks, float lr,
               const MuonOptions& options);

}  // namespace dsv41::optim
