#pragma once
// The learning-rate schedule (report §4.2.2): "linearly warmed up over the first 2000 steps and
// then maintained at 2.6 × 10⁻⁴", followed by a decay stage (§2.5 speaks of "the onset of
// learning-rate decay") whose shape our copy of the report cuts off. We decay as DeepSeek-V3 did,
// along a cosine to a tenth of the peak (docs/training.md, "Learning-rate schedule"). For the
// update of step s (0-based):
//
//   s < W:                 η = peak · (s + 1) / W
//   W ≤ s < D:             η = peak
//   D ≤ s:                 η = f + (peak − f) · (1 + cos(π p)) / 2,  p = min(1, (s − D) / S),  f = r · peak
//
// with W = warmup_steps, D = decay_start, S = decay_steps (0: no decay), r = final_ratio.
#include <cstdint>

namespace dsv41::optim {

struct Schedule {
  double peak_lr = 2.6e-4;
  int64_t warmup_steps = 2000;
  int64_t decay_start = 0;  // the first step of the decay (≥ warmup_steps)
  int64_t decay_steps = 0;  // its length; 0 keeps the peak after the warm-up
  double final_ratio = 0.1;

  // Throws dsv41::Error naming the field that is out of range.
  void validate() const;
  // η of step `step` (0-based), the rate before any group's multiplier.
  double lr(int64_t step) const;
};

}  // namespace dsv41::optim
