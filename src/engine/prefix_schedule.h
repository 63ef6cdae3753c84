#pragma once
// DSpark's hardware-aware prefix scheduler (the DSpark paper's Algorithm 1; reference notes
// components.md §6.2): how many of its drafted tokens each speculating sequence sends to the
// target's verification pass in a step — and, before that, which sequences draft at all.
//
// The drafter's confidence head gives, per draft position k, c_k = σ(z_k): the probability that
// draft k is accepted given that every earlier one was. A sequence's prefix survival a_k =
// Π_{i≤k} c_i is then the probability that its first k drafts are all accepted, and verifying its
// first ℓ drafts yields 1 + Σ_{k≤ℓ} a_k tokens in expectation (the target's own token always
// comes). The paper prices a step as one target pass over B = Σ_r (1 + ℓ_r) rows, t_verify(B) =
// 1 / SPS(B), and chooses the lengths that maximise expected tokens per second. This engine's
// step is priced as it runs (engine/scheduler.h): the sequences that do not draft decode in the
// step's batch, a decode pass of their own, t_plain(R − n) from the decode path's profile (on the
// GPU a graph replay, cheaper than a general pass of as many rows); the n that draft pay the
// drafter's call t_draft(n), the verification pass over their B = Σ (1 + ℓ_r) rows, and — in this
// engine — the pass that runs again the anchor and accepted drafts of the sequences with a
// rejected draft (Session::end_verify's redo), t_redo, expected. A step that drafts nothing is
// plain decoding's R / t_plain(R). The scheduler takes the drafts in decreasing survival — each
// sequence's in its order, as survival never grows along a draft — and keeps the prefix of that
// order with the highest rate (ties: the shorter; the paper stops at the first draft that lowers
// the rate, the same prefix where the rate rises then falls along the order). docs/decisions.md
// says where this departs from the paper.
//
// Drafting costs before the confidences exist, so whether a sequence drafts at all is decided
// first, by the same rule over an estimate of its survival from its earlier steps
// (SurvivalEstimate); after the drafting call, the lengths are chosen from the drafts'
// confidences, the call's and the batch's time counted in the step's.
#include <cstdint>
#include <span>
#include <vector>

#include "forward/executor.h"

namespace dsv41 {

// Target passes per second by the rows of a pass, measured at some row counts (the engine's
// profile). Between two measured counts a pass's time is interpolated linearly in the rows; past
// the last, it grows in proportion to the rows (at least that long per row); below the first,
// it is the first's.
//
// The drafter's profile is a StepRate too, its "rows" the sequences drafting together in one call.
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

// The executor's verification profile: at each of `rows` (increasing), the median over `repeats`
// of a target pass of that many rows with every row's logits (a verification's shape) after a
// context of `context` tokens, undone after each (Executor::mark, rewind: an executor that
// speculates).
StepRate measure_step_rate(Executor& executor, std::span<const int64_t> rows, int64_t context, int repeats = 3);

// The executor's decode profile: at each of `sequences` (increasing), the median over `repeats` of
// one pass of that many sequences with a row each, each row's token chosen by the executor
// (greedy), as the scheduler's batch decodes — on CUDA the decode graph's replay — each sequence
// after a context of `context` tokens, undone after each. Its "rows" are the sequences.
StepRate measure_plain_rate(Executor& executor, std::span<const int64_t> sequences, int64_t context, int repeats = 3);

// The drafter's profile: at each of `sequences` (increasing), the median over `repeats` of one
// Executor::dspark_drafts call drafting for that many sequences (greedy, as the executor chooses
// them), each after a context of `context` tokens whose features filled its drafter windows.
StepRate measure_draft_rate(Executor& executor, std::span<const int64_t> sequences, int64_t context, int repeats = 3);

// a_k for k = 1 .. γ from the confidence head's raw logits z_1 .. z_γ (c_k = σ(z_k): the reference
// notes' temperatures T_k are not in the checkpoint and default to 1).
std::vector<double> prefix_survival(std::span<const float> confidence);

// What a step costs beside its verification pass. The default is the paper's objective.
struct StepCost {
  double seconds_outside = 0;  // the step's time outside the pass: the drafting call, the batch's decode pass
  // Whether a rejected draft costs the redo pass. Expected: with P = 1 − Π_r a_{r,ℓ_r} (some
  // verified draft rejected) and E = Σ_r Σ_{j<ℓ_r} (1 + j)(a_{r,j} − a_{r,j+1}) (a_{r,0} = 1) the
  // expected rows it runs, t_redo = P · t_verify(E / P).
  bool redo = false;
  int64_t tokens_outside = 0;  // the step's tokens outside the pass: a token each for the sequences decoding in the batch
};

// ℓ_r ∈ [0, size of survival[r]] for each sequence r of the verification pass (survival[r] = its
// a_1 .. a_γ; empty for one without drafts, a row all the same), from the verification profile
// `sps`.
std::vector<int> verification_lengths(std::span<const std::vector<double>> survival, const StepRate& sps, const StepCost& cost = {});

// Before drafting: whether each of the step's speculating sequences drafts, from estimated[r] (its
// SurvivalEstimate) — those given a length > 0 by the rule above, the step priced as the engine
// runs it: t_plain(R − n) from `plain` for the batch's decode pass (none when every sequence
// drafts), t_draft(n) from `draft`, t_verify from `sps` over the drafting sequences' rows alone,
// and the redo as `redo` says. None: the step is plain decoding's, R / t_plain(R), which the rule
// compares every choice with.
std::vector<bool> drafting_sequences(std::span<const std::vector<double>> estimated, const StepRate& plain, const StepRate& sps,
                                     const StepRate& draft, bool redo);

// How a sequence's survival is estimated before it drafts (SurvivalEstimate).
struct DraftingPolicy {
  // A new sequence's prior: each draft accepted with this probability (a_k = prior^k), counted as
  // `prior_weight` observations.
  double prior = 0.7;
  double prior_weight = 0.5;
  // Each later step weighs `decay` times the one after it (the prior's weight decays alike).
  double decay = 0.7;
  // After this many steps in a row without drafting, the estimate is the prior again: a sequence
  // that stopped drafting is tried again (a probe), where the prior would pay.
  int reprobe_after = 32;
};

// A sequence's expected prefix survival for its next draft: a decayed average of what its drafted
// steps showed, begun at the prior. A step that verified ℓ drafts and accepted A of them shows
// survival o_k = 1 for k ≤ A; 0 for A < k ≤ ℓ, and for every k > ℓ after a rejection; and where
// all ℓ were accepted, for k > ℓ the confidence head's survival given the first ℓ:
// Π_{ℓ<i≤k} c_i. Steps without drafting show nothing.
class SurvivalEstimate {
 public:
  SurvivalEstimate(int block, const DraftingPolicy& policy);  // block: γ, policy checked
  const std::vector<double>& survival() const { return survival_; }  // a_1 .. a_γ, never growing
  // A drafted step: the draft's survival from its confidences (prefix_survival), the drafts verified and accepted.
  void drafted(std::span<const double> survival, int verified, int accepted);
  // A step without drafting.
  void plain();

 private:
  void start();  // the prior
  DraftingPolicy policy_;
  std::vector<double> sum_;  // Σ weight · o_k
  double weight_ = 0;        // Σ weight
  int plain_run_ = 0;  // steps without drafting since the last draft or probe
  std::vector<double> survival_;
};

}  // namespace dsv41
