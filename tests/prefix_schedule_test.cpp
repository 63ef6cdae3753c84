// DSpark's prefix scheduler (engine/prefix_schedule.h) on hand-worked cases: survival from the
// confidence logits, the step-rate profile, and the verification lengths under a flat profile (a
// memory-bound pass: rows are free), a linear one (compute-bound: speculation cannot pay) and one
// with a knee, each choice derived in the comments from τ · SPS(B); then the step's costs beyond
// the paper's (the drafting call, the redo pass): whether a sequence drafts at all, the lengths
// shrinking as the batch fills the pass, and a sequence's survival estimate, its decay and its
// re-probe.
#include "engine/prefix_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
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

// A sequence whose drafts survive 0.9, 0.81, 0.729, 0.6561 (Σ 3.0951) on a memory-bound pass (10 ms
// at any row count), the paper's objective with the drafting call's time t_d: verifying all four
// gives 4.0951 / (t_d + 0.01) tokens/s against plain decoding's 100, so drafting pays exactly when
// t_d < 30.95 ms.
TEST(PrefixSchedule, DraftingPaysOnlyWhatItSaves) {
  const std::vector<std::vector<double>> a = {{0.9, 0.81, 0.729, 0.6561}};
  const StepRate sps({{1, 100}, {64, 100}});
  EXPECT_EQ(drafting_sequences(a, sps, sps, StepRate({{1, 1 / 0.032}}), false), std::vector<bool>{false});  // 4.0951 / 0.042 = 97.5
  EXPECT_EQ(drafting_sequences(a, sps, sps, StepRate({{1, 1 / 0.030}}), false), std::vector<bool>{true});   // 4.0951 / 0.040 = 102.4
  // With the redo: all four verified are all accepted with 0.6561, else a redo of E = 0.1 + 2 · 0.09
  // + 3 · 0.081 + 4 · 0.0729 = 0.8146 rows expected: 10 ms · 0.3439 more. A 1 ms draft: 4.0951 /
  // 0.014439 = 283.6 tokens/s; a 30 ms one no longer pays (4.0951 / 0.043439 = 94.3).
  EXPECT_EQ(drafting_sequences(a, sps, sps, StepRate({{1, 1000}}), true), std::vector<bool>{true});
  EXPECT_EQ(drafting_sequences(a, sps, sps, StepRate({{1, 1 / 0.030}}), true), std::vector<bool>{false});
}

TEST(PrefixSchedule, DraftsThatAreNeverAcceptedAreNotMade) {
  // Survival 0.01 then 0.001, per sequence (the two are alike and the profile is flat: both run in
  // one pass of the same cost, so each rate below doubles for the pair). The paper's objective with
  // a 1 ms draft: at best 1.011 tokens in 11 ms (91.9/s) against 100/s. With the redo even a free
  // draft loses: one verified draft is rejected 99% of the time and its redo costs a pass,
  // 1.01 / (0.01 + 0.0099) = 50.8/s.
  const std::vector<std::vector<double>> a = {{0.01, 0.001}, {0.01, 0.001}};
  const StepRate sps({{1, 100}, {64, 100}});
  EXPECT_EQ(drafting_sequences(a, sps, sps, StepRate({{1, 1000}}), false), (std::vector<bool>{false, false}));
  EXPECT_EQ(drafting_sequences(a, sps, sps, StepRate({{1, 1e9}}), true), (std::vector<bool>{false, false}));
  EXPECT_EQ(verification_lengths(a, sps, StepCost{0, true}), (std::vector<int>{0, 0}));
}

TEST(PrefixSchedule, GoodCheapDraftsAreAllMadeAndVerified) {
  // Four sequences surviving 0.9^k, a 1 ms drafting call for any of them, rows free: every draft
  // adds tokens for a share of the redo's pass. All drafts: 16.38 tokens in 1 + 10 + (1 − 0.6561^4)
  // · 10 = 19.15 ms, 855/s, against 400/s plain; each shorter prefix of the order has fewer tokens
  // per ms (all 0.9s: 7.6 in 14.44 ms, 526/s; and the 0.81s: 10.84 in 16.70, 649/s; ...).
  const std::vector<double> one = {0.9, 0.81, 0.729, 0.6561};
  const std::vector<std::vector<double>> a(4, one);
  const StepRate sps({{1, 100}, {64, 100}}), draft({{1, 1000}, {64, 1000}});
  EXPECT_EQ(drafting_sequences(a, sps, sps, draft, true), std::vector<bool>(4, true));
  EXPECT_EQ(verification_lengths(a, sps, StepCost{0.001, true}), std::vector<int>(4, 4));
}

// The engine's step (engine/scheduler.h): a sequence that drafts leaves the batch's decode pass for
// a verification pass of its own. Eight sequences, one whose drafts survive 0.9, 0.81, 0.729,
// 0.6561 (Σ 3.0951), seven whose drafts are never accepted; the decode pass 20 ms at any batch (a
// graph replay, memory-bound), the verification pass 20 ms up to 16 rows then in proportion, a
// 1 ms drafting call, no redo. Plain: 8 tokens in 20 ms, 400/s. The one good drafter alone: 11.0951
// tokens in 20 (the other seven) + 1 + 20 ms = 270.6/s. Every sequence drafting (one pass, the
// order taking the zero drafts of sequences 1 .. 6 whole before sequence 7's first): 37 rows,
// 1 + 46.25 ms, 235/s. Nobody drafts — where the paper's single pass of 12 rows (21 ms, 528/s)
// would.
TEST(PrefixSchedule, ADraftingSequenceLeavesTheBatchsDecodePass) {
  std::vector<std::vector<double>> a(8, std::vector<double>(4, 0.0));
  a[0] = {0.9, 0.81, 0.729, 0.6561};
  const StepRate plain({{1, 50}, {64, 50}}), sps({{1, 50}, {16, 50}}), draft({{1, 1000}, {64, 1000}});
  EXPECT_EQ(drafting_sequences(a, plain, sps, draft, false), std::vector<bool>(8, false));
  // Eight good drafters: all draft and the batch's pass is gone. Best: each its first draft, 8 +
  // 8 · 0.9 = 15.2 tokens in 1 + 20 ms (16 rows), 724/s, against 400/s (each 0.81 more: 16 rows
  // and beyond, in proportion: 16.01 in 22.25 ms, 720/s, and falling).
  const std::vector<std::vector<double>> good(8, a[0]);
  EXPECT_EQ(drafting_sequences(good, plain, sps, draft, false), std::vector<bool>(8, true));
}

// After drafting, the sequences that decoded in the batch count in the step's rate: a verification
// pass of 5 ms for one row, 6 ms for two; one draft surviving 0.2; 10 ms outside the pass. Alone
// (its tokens the step's only ones): 1 / 15 ms = 66.7/s against 1.2 / 16 ms = 75/s, so the draft is
// verified; with 8 tokens decoded in the batch: 9 / 15 = 600/s against 9.2 / 16 = 575/s, so not.
TEST(PrefixSchedule, TheBatchsTokensWeighAgainstAVerifiedDraft) {
  const StepRate sps({{1, 200}, {2, 1 / 0.006}});
  const std::vector<std::vector<double>> a = {{0.2}};
  EXPECT_EQ(verification_lengths(a, sps, StepCost{0.010, false, 0}), std::vector<int>{1});
  EXPECT_EQ(verification_lengths(a, sps, StepCost{0.010, false, 8}), std::vector<int>{0});
}

TEST(PrefixSchedule, LengthsShrinkAsTheBatchFillsThePass) {
  // 100 ms a pass up to 16 rows, then in proportion to the rows; a 1 ms drafting call; each
  // sequence's drafts survive 0.9, 0.8, 0.6, 0.3. Two sequences: 10 rows fit, all verified. Eight:
  // their eight 0.9s fill 16 rows (15.2 tokens in 101 ms, 150.5/s); a 0.8 more is 16 in 107.25 ms
  // (149.2/s), and later prefixes fall further: one each. Sixteen fill the pass alone (16 in 101
  // ms, 158.4/s); a 0.9 more is 16.9 in 107.25 ms (157.6/s): none.
  const StepRate sps({{1, 10}, {16, 10}});
  const std::vector<double> one = {0.9, 0.8, 0.6, 0.3};
  const auto lengths = [&](int batch, bool redo) {
    return verification_lengths(std::vector<std::vector<double>>(size_t(batch), one), sps, StepCost{0.001, redo});
  };
  EXPECT_EQ(lengths(2, false), std::vector<int>(2, 4));
  EXPECT_EQ(lengths(8, false), std::vector<int>(8, 1));
  EXPECT_EQ(lengths(16, false), std::vector<int>(16, 0));
  // With the redo too, the drafts verified per sequence never grow with the batch, and none are
  // verified once the batch fills the pass.
  double before = 4;
  for (int batch = 1; batch <= 24; ++batch) {
    const std::vector<int> l = lengths(batch, true);
    const double mean = double(std::accumulate(l.begin(), l.end(), 0)) / batch;
    EXPECT_LE(mean, before) << "batch " << batch;
    before = mean;
  }
  EXPECT_EQ(lengths(16, true), std::vector<int>(16, 0));
}

// Prior 0.5 as one observation, decay 0.5, γ = 2: the estimate starts at (0.5, 0.25); each drafted
// step weighs the sums by 0.5 and adds its observation (weight 1).
TEST(PrefixSchedule, TheSurvivalEstimateAveragesWhatStepsShowed) {
  const DraftingPolicy policy{.prior = 0.5, .prior_weight = 1, .decay = 0.5, .reprobe_after = 3};
  SurvivalEstimate e(2, policy);
  const std::vector<double> confidence = {0.8, 0.4};
  EXPECT_EQ(e.survival(), (std::vector<double>{0.5, 0.25}));
  // One verified and accepted: o = (1, 0.4 / 0.8 = 0.5): sums (0.25 + 1, 0.125 + 0.5) over 1.5.
  e.drafted(confidence, 1, 1);
  EXPECT_NEAR(e.survival()[0], 1.25 / 1.5, 1e-12);
  EXPECT_NEAR(e.survival()[1], 0.625 / 1.5, 1e-12);
  // Both verified, the first rejected: o = (0, 0): sums (0.625, 0.3125) over 1.75.
  e.drafted(confidence, 2, 0);
  EXPECT_NEAR(e.survival()[0], 0.625 / 1.75, 1e-12);
  EXPECT_NEAR(e.survival()[1], 0.3125 / 1.75, 1e-12);
  // None verified: the confidences themselves, o = (0.8, 0.4): sums (1.1125, 0.55625) over 1.875.
  e.drafted(confidence, 0, 0);
  EXPECT_NEAR(e.survival()[0], 1.1125 / 1.875, 1e-12);
  EXPECT_NEAR(e.survival()[1], 0.55625 / 1.875, 1e-12);
  // Steps without drafting change nothing until the third in a row, which brings the prior back.
  const std::vector<double> now = e.survival();
  e.plain();
  e.plain();
  EXPECT_EQ(e.survival(), now);
  e.plain();
  EXPECT_EQ(e.survival(), (std::vector<double>{0.5, 0.25}));
  // A drafted step starts the count again.
  e.drafted(confidence, 2, 0);
  const std::vector<double> after = e.survival();
  e.plain();
  e.plain();
  EXPECT_EQ(e.survival(), after);
}

// The default prior (0.7^k as half an observation, decay 0.7) on a memory-bound pass (10 ms) with a
// 1 ms drafting call, γ = 4, re-probing after 4 plain steps. The prior drafts (2.77 tokens, 1.77 of
// them drafts, for 1 + 10 + 7.6 ms of expected redo: 149/s against 100). One step with nothing
// accepted leaves 0.35 / 1.35 of the prior, (0.181, 0.127, 0.089, 0.062): the best prefix, all
// four, gives 1.46 tokens in 20.4 ms (71.6/s), so the sequence stops drafting; it drafts again at
// its fourth plain step.
TEST(PrefixSchedule, ASequenceThatStoppedDraftingIsProbedAgain) {
  DraftingPolicy policy;
  policy.reprobe_after = 4;
  SurvivalEstimate e(4, policy);
  const StepRate sps({{1, 100}, {64, 100}}), draft({{1, 1000}});
  const auto drafts = [&]() -> bool { return drafting_sequences(std::vector<std::vector<double>>{e.survival()}, sps, sps, draft, true)[0]; };
  EXPECT_TRUE(drafts());
  e.drafted(std::vector<double>{0.5, 0.25, 0.125, 0.0625}, 4, 0);
  for (int plain = 0; plain < 4; ++plain) {
    EXPECT_FALSE(drafts()) << "after " << plain << " plain steps";
    e.plain();
  }
  EXPECT_TRUE(drafts());
}

TEST(PrefixSchedule, RefusesABadPolicyOrObservation) {
  EXPECT_NE(test::error_of([] { SurvivalEstimate(4, DraftingPolicy{.prior = 1.5}); }).find("prior in [0, 1]"), std::string::npos);
  EXPECT_NE(test::error_of([] { SurvivalEstimate(4, DraftingPolicy{.decay = 1}); }).find("decay in (0, 1)"), std::string::npos);
  EXPECT_NE(test::error_of([] { SurvivalEstimate(0, DraftingPolicy{}); }).find("block of 1 or more"), std::string::npos);
  SurvivalEstimate e(2, DraftingPolicy{});
  EXPECT_NE(test::error_of([&] { e.drafted(std::vector<double>{0.5, 0.25}, 1, 2); }).find("accepted <= verified"), std::string::npos);
  EXPECT_NE(test::error_of([&] { e.drafted(std::vector<double>{0.5}, 1, 0); }).find("2 survivals"), std::string::npos);
  const std::vector<std::vector<double>> a = {{0.5}};
  EXPECT_NE(test::error_of([&] { verification_lengths(a, StepRate({{1, 1.0}}), StepCost{-1, false}); }).find("0 s or more"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { verification_lengths(a, StepRate({{1, 1.0}}), StepCost{0, false, -1}); }).find("0 tokens or more"),
            std::string::npos);
}

// One point per count asked for, each a positive rate (how fast is the machine's business, not the test's).
void expect_points(const StepRate& rate, const std::vector<int64_t>& counts) {
  ASSERT_EQ(rate.points().size(), counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(rate.points()[i].rows, counts[i]);
    EXPECT_GT(rate.points()[i].per_second, 0);
  }
}

// The three profiles on the CPU executor over the v41-tiny fixture (which has Engram layers):
// verification passes by rows, drafting calls and decode passes by sequences.
TEST(PrefixSchedule, MeasuresTheExecutorsProfiles) {
  const auto model = Model::load(test::fixture_dir("v41-tiny"));
  CpuExecutor executor(*model);
  const std::vector<int64_t> rows = {1, 3, 6}, sequences = {1, 2, 4}, none = {0};
  expect_points(measure_step_rate(executor, rows, 20, 3), rows);
  expect_points(measure_draft_rate(executor, sequences, 20, 3), sequences);
  expect_points(measure_plain_rate(executor, sequences, 20, 3), sequences);
  EXPECT_NE(test::error_of([&] { measure_step_rate(executor, {}, 20); }).find("row counts"), std::string::npos);
  EXPECT_NE(test::error_of([&] { measure_draft_rate(executor, {}, 20); }).find("sequence counts"), std::string::npos);
  EXPECT_NE(test::error_of([&] { measure_plain_rate(executor, {}, 20); }).find("sequence counts"), std::string::npos);
  EXPECT_NE(test::error_of([&] { measure_plain_rate(executor, none, 20); }).find("of 1 or more"), std::string::npos);
}

}  // namespace
}  // namespace dsv41
