// The learning-rate schedule (schedule.h) at chosen steps, against values worked out by hand.
#include <gtest/gtest.h>

#include "base/error.h"
#include "train/optim/schedule.h"

namespace dsv41::optim {
namespace {

// Doubles throughout: 1e-14 relative covers a few roundings and the last-bit differences of
// cosines between libms.
constexpr double kRel = 1e-14;

TEST(Schedule, ReportDefaultsWarmUpOver2000StepsToThePeak) {
  const Schedule s;  // 2.6e-4 after 2000 steps, no decay configured
  EXPECT_NEAR(s.lr(0), 2.6e-4 / 2000, 2.6e-4 * kRel);
  EXPECT_NEAR(s.lr(999), 2.6e-4 / 2, 2.6e-4 * kRel);
  EXPECT_NEAR(s.lr(1999), 2.6e-4, 2.6e-4 * kRel);
  EXPECT_EQ(s.lr(2000), 2.6e-4);
  EXPECT_EQ(s.lr(10'000'000), 2.6e-4);
}

// peak 1e-3, W = 100, D = 500, S = 500, r = 0.1 (floor 1e-4):
//   s = 0: 1e-3 · 1/100 = 1e-5;  s = 49: 5e-4;  s = 99 … 500: 1e-3
//   s = 625: p = 1/4, 1e-4 + 9e-4 · (1 + cos(π/4)) / 2 = 1e-4 + 9e-4 · 0.853553390593… = 8.68198051533…e-4
//   s = 750: p = 1/2, 1e-4 + 9e-4 / 2 = 5.5e-4;  s ≥ 1000: 1e-4
TEST(Schedule, WarmUpPlateauAndCosineDecayAtChosenSteps) {
  Schedule s;
  s.peak_lr = 1e-3;
  s.warmup_steps = 100;
  s.decay_start = 500;
  s.decay_steps = 500;
  s.final_ratio = 0.1;
  const std::pair<int64_t, double> expected[] = {{0, 1e-5},    {49, 5e-4},    {99, 1e-3},
                                                 {100, 1e-3},  {499, 1e-3},   {500, 1e-3},
                                                 {625, 8.68198051533946e-4}, {750, 5.5e-4},
                                                 {1000, 1e-4}, {5000, 1e-4}};
  for (auto [step, lr] : expected) EXPECT_NEAR(s.lr(step), lr, 1e-3 * kRel) << "step " << step;
  for (int64_t step = 1; step < 1100; ++step) {
    if (step < 100) EXPECT_GT(s.lr(step), s.lr(step - 1)) << step;
    else EXPECT_LE(s.lr(step), s.lr(step - 1)) << step;
  }
}

TEST(Schedule, RefusesInconsistentSettings) {
  Schedule s;
  s.decay_steps = 100;
  s.decay_start = 1000;  // before the end of the 2000-step warm-up
  EXPECT_THROW(s.lr(0), Error);
  s.decay_start = 2000;
  EXPECT_NO_THROW(s.lr(0));
  s.final_ratio = 1.5;
  EXPECT_THROW(s.validate(), Error);
  s.final_ratio = 0.1;
  s.peak_lr = 0;
  EXPECT_THROW(s.validate(), Error);
  s.peak_lr = 1e-3;
  EXPECT_THROW(s.lr(-1), Error);
}

}  // namespace
}  // namespace dsv41::optim
