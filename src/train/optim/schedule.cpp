#include "train/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "base/error.h"

namespace dsv41::optim {

void Schedule::validate() const {
  if (!(peak_lr > 0) || !std::isfinite(peak_lr))
    fail("learning-rate schedule", "peak_lr a positive finite number", std::to_string(peak_lr));
  if (warmup_steps < 0) fail("learning-rate schedule", "warmup_steps >= 0", std::to_string(warmup_steps));
  if (decay_steps < 0) fail("learning-rate schedule", "decay_steps >= 0", std::to_string(decay_steps));
  if (decay_steps > 0 && decay_start < warmup_steps)
    fail("learning-rate schedule", "decay_start >= warmup_steps (" + std::to_string(warmup_steps) + ")",
         std::to_string(decay_start));
  if (!(final_ratio >= 0 && final_ratio <= 1))
    fail("learning-rate schedule", "final_ratio in [0, 1]", std::to_string(final_ratio));
}

double Schedule::lr(int64_t step) const {
  validate();
  if (step < 0) fail("learning-rate schedule", "a step >= 0", std::to_string(step));
  if (step < warmup_steps) return peak_lr * double(step + 1) / double(warmup_steps);
  if (decay_steps == 0 || step < decay_start) return peak_lr;
  const double p = std::min(1.0, double(step - decay_start) / double(decay_steps));
  const double floor = final_ratio * peak_lr;
  return floor + (peak_lr - floor) * (1 + std::cos(std::numbers::pi * p)) / 2;
}

}  // namespace dsv41::optim
