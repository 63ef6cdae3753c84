// DSpark's prefix scheduler (engine/prefix_schedule.h) on hand-worked cases: survival from the
// confidence logits, the step-rate profile, and the verification lengths under a flat profile (a
// memory-bound pass: rows are free), a linear one (compute-bound: speculation cannot pay) and one
// with a knee, each choice derived in the comments from τ · SPS(B).
#include "engine/prefix_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "fixture.h"
#include "forward/model.h"
#include "test_util.h"

namespace dsv41 {
namespace {

TEST(PrefixSchedule, SurvivalIsTheProductOfTheConfidences) {
  // σ(0) = 1/2, σ(ln 3) = 3/4, σ(−ln 3) = 1/4: a = 1/2, 3/8, 3/32.
  const std::vector<float> z = {0.0f, std::log(3.0f), -std::log(3.0f)};
  const std::vector<double> a = prefix_survival(z);
  ASSERT_EQ(a.size(), 3u);
  // z holds ln 3 rounded to float: σ moves by at most 1e-7 relative.
  EXPECT_NEAR(a[0], 0.5, 1e-12);
  EXPECT_NEAR(a[1], 0.375, 1e-7);
  EXPECT_NEAR(a[2], 0.09375, 1e-7);
  EXPECT_TRUE(prefix_survival({}).empty());
}

// Points at 1, 3 and 4 rows; 2 rows interpolate the time (1/100 and 1/80 s: 1/88.9 s), 8 rows
// take twice the time of 4.
TEST(PrefixSchedule, StepRateInterpolatesThePassTime) {
  const StepRate sps({{1, 100}, {3, 80}, {4, 50}});
  EXPECT_EQ(sps.at(1), 100);
  EXPECT_EQ(sps.at(3), 80);
  EXPECT_DOUBLE_EQ(sps.at(2), 1 / (0.5 / 100 + 0.5 / 80));
  EXPECT_DOUBLE_EQ(sps.at(8), 25);
  const StepRate from_two({{2, 10}});
  EXPECT_EQ(from_two.at(1), 10);  // below the first point: the first's rate
  EXPECT_NE(test::error_of([&] { sps.at(0); }).find("at least one row"), std::string::npos);
  EXPECT_NE(test::error_of([] { StepRate({}); }).find("one row count or more"), std::string::npos);
  EXPECT_NE(test::error_of([] { StepRate({{1, 10}, {2, 0}}); }).find("positive finite"), std::string::npos);
  EXPECT_NE(test::error_of([] { StepRate({{2, 10}, {2, 9}}); }).find("increasing"), std::string::npos);
}

// A table of rates at 1 .. n rows.
StepRate table(const std::vector<double>& per_second) {
  std::vector<StepRate::Point> points;
  for (size_t i = 0; i < per_second.size(); ++i) points.push_back({int64_t(i) + 1, per_second[i]});
  return StepRate(points);
}

TEST(PrefixSchedule, FreeRowsTakeEveryDraftThatMayBeAccepted) {
  // A pass costs the same at any row count here: each draft with a > 0 adds expected tokens at no
  // cost; one with a = 0 adds none (the rate stays equal, not larger), and nothing after it.
  const StepRate sps = table(std::vector<double>(64, 10.0));
  const std::vector<std::vector<double>> a = {{0.9, 0.8}, {0.5, 0.1, 0.0}, {}};
  EXPECT_EQ(verification_lengths(a, sps), (std::vector<int>{2, 2, 0}));
}

TEST(PrefixSchedule, ComputeBoundPassesVerifyNothing) {
  // SPS(B) = 1/B: the rate is the expected tokens per row, 1 with no drafts; a draft adds a < 1
  // token and a whole row, so the first one already lowers it (2.9 / 3 < 2 / 2).
  std::vector<double> rate;
  for (int b = 1; b <= 16; ++b) rate.push_back(1.0 / b);
  const std::vector<std::vector<double>> a = {{0.9, 0.6}, {0.3}};
  EXPECT_EQ(verification_lengths(a, table(rate)), (std::vector<int>{0, 0}));
}

TEST(PrefixSchedule, TheKneeOfTheProfileStopsTheDrafts) {
  // SPS = 10 up to 4 rows, then 40 / B. Two sequences (B = 2, τ = 2, rate 20); drafts by survival:
  // 0.9 (seq 0) → τ 2.9 at 3 rows: 29; 0.8 (seq 0) → 3.7 at 4: 37; 0.7 (seq 1) → 4.4 at 5 rows,
  // 8 passes/s: 35.2 < 37, stop. Sequence 0 verifies 2 drafts, sequence 1 none.
  std::vector<double> rate;
  for (int b = 1; b <= 8; ++b) rate.push_back(b <= 4 ? 10.0 : 40.0 / b);
  const std::vector<std::vector<double>> a = {{0.9, 0.8, 0.5}, {0.7, 0.2}};
  EXPECT_EQ(verification_lengths(a, table(rate)), (std::vector<int>{2, 0}));
}

TEST(PrefixSchedule, RefusesWhatIsNotAPrefixSurvival) {
  const StepRate sps({{1, 1.0}});
  const std::vector<std::vector<double>> growing = {{0.5, 0.6}}, outside = {{1.5}};
  EXPECT_NE(test::error_of([&] { verification_lengths(growing, sps); }).find("never grows"), std::string::npos);
  EXPECT_NE(test::error_of([&] { verification_lengths(outside, sps); }).find("[0, 1]"), std::string::npos);
  EXPECT_TRUE(verification_lengths({}, sps).empty());
}

// The profile on the CPU executor over the v41-tiny fixture (which has Engram layers): one point per
// row count asked for, each a positive rate (how fast is the machine's business, not the test's).
TEST(PrefixSchedule, MeasuresTheExecutorsPasses) {
  const auto model = Model::load(test::fixture_dir("v41-tiny"));
  CpuExecutor executor(*model);
  const std::vector<int64_t> rows = {1, 3, 6};
  const StepRate sps = measure_step_rate(executor, rows, 20, 3);
  ASSERT_EQ(sps.points().size(), 3u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(sps.points()[i].rows, rows[i]);
    EXPECT_GT(sps.points()[i].per_second, 0);
  }
  EXPECT_NE(test::error_of([&] { measure_step_rate(executor, {}, 20); }).find("row counts"), std::string::npos);
}

}  // namespace
}  // namespace dsv41
