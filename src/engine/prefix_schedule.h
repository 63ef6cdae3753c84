#pragma once
// DSpark's hardware-aware prefix scheduler (the DSpark paper's Algorithm 1; reference notes
// components.md §6.2): how many of its drafted tokens each speculating sequence sends to the
// target's verification pass in a step.
//
// The drafter's confidence head gives, per draft position k, c_k = σ(z_k): the probability that
// draft k is accepted given that every earlier one was. A sequence's prefix survival a_k =
// Π_{i≤k} c_i is then the probability that its first k drafts are all accepted, and verifying its
// first ℓ drafts yields 1 + Σ_{k≤ℓ} a_k tokens in expectation (the target's own token always
// comes). The step costs what the target's pass over B = Σ_r (1 + ℓ_r) rows costs, 1 / SPS(B) for
// SPS the engine's profile of passes per second by row count. The scheduler takes the drafts in
// decreasing survival — each sequence's in its order, as survival never grows along a draft — while
// the expected tokens per second τ · SPS(B) grows, and stops at the first that would lower it.
#include <cstdint>
#include <span>
#include <vector>

#include "forward/executor.h"

namespace dsv41 {

// Target passes per second by the rows of a pass, measured at some row counts (the engine's
// profile). Between two measured counts a pass's time is interpolated linearly in the rows; past
// the last, it grows in proportion to the rows (at least that long per row); below the first,
// it is the first's.
class StepRate {
 public:
  struct Point {
    int64_t rows;
    double per_second;
  };
  explicit StepRate(std::vector<Point> points);  // rows strictly increasing from 1 or more
  double at(int64_t rows) const;                 // rows ≥ 1
  const std::vector<Point>& points() const { return points_; }

 private:
  std::vector<Point> points_;
};

// The executor's profile: at each of `rows` (increasing), the median over `repeats` of a target
// pass of that many rows with every row's logits (a verification's shape) after a context of
// `context` tokens, undone after each (Executor::mark, rewind: an executor that speculates).
StepRate measure_step_rate(Executor& executor, std::span<const int64_t> rows, int64_t context, int repeats = 3);

// a_k for k = 1 .. γ from the confidence head's raw logits z_1 .. z_γ (c_k = σ(z_k): the reference
// notes' temperatures T_k are not in the checkpoint and default to 1).
std::vector<double> prefix_survival(std::span<const float> confidence);

// ℓ_r ∈ [0, size of survival[r]] for each sequence r (survival[r] = its a_1 .. a_γ).
std::vector<int> verification_lengths(std::span<const std::vector<double>> survival, const StepRate& sps);

}  // namespace dsv41
