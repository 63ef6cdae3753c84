#include "engine/prefix_schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>

#include "base/error.h"

namespace dsv41 {

StepRate::StepRate(std::vector<Point> points) : points_(std::move(points)) {
  if (points_.empty()) fail("step rate", "passes per second at one row count or more", "none");
  for (size_t i = 0; i < points_.size(); ++i) {
    const Point& p = points_[i];
    if (!(p.per_second > 0) || !std::isfinite(p.per_second))
      fail("step rate", "positive finite passes per second", std::to_string(p.per_second) + " at " + std::to_string(p.rows) + " rows");
    if (p.rows < 1 || (i > 0 && p.rows <= points_[i - 1].rows))
      fail("step rate", "row counts increasing from 1 or more", std::to_string(p.rows) + " rows at point " + std::to_string(i));
  }
}

double StepRate::at(int64_t rows) const {
  if (rows < 1) fail("step rate", "a pass of at least one row", std::to_string(rows) + " rows");
  if (rows <= points_.front().rows) return points_.front().per_second;
  const Point& last = points_.back();
  if (rows >= last.rows) return last.per_second * double(last.rows) / double(rows);
  const auto hi = std::lower_bound(points_.begin(), points_.end(), rows, [](const Point& p, int64_t r) { return p.rows < r; });
  const auto lo = hi - 1;
  const double f = double(rows - lo->rows) / double(hi->rows - lo->rows);
  return 1 / ((1 - f) / lo->per_second + f / hi->per_second);
}

namespace {

// Rows of zeros for the profiles' passes: token ids and Engram rows do not change a pass's work.
struct Zeros {
  std::vector<int> tokens;
  std::vector<int64_t> engram;
  bool has_engram;
  Zeros(const Config& c, int64_t rows)
      : tokens(size_t(rows), 0),
        engram(size_t(rows * int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns()), 0),
        has_engram(!engram.empty()) {}
  BatchItem item(Sequence& seq, int64_t rows, ForwardOptions options = {}) const {
    return BatchItem{&seq, std::span<const int>(tokens.data(), size_t(rows)), has_engram ? engram.data() : nullptr, options};
  }
};

// The median over `repeats` of `pass`'s wall time, as passes per second.
template <typename Pass>
double median_rate(int repeats, const Pass& pass) {
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) seconds.push_back(pass());
  std::nth_element(seconds.begin(), seconds.begin() + repeats / 2, seconds.end());
  return 1 / std::max(seconds[size_t(repeats / 2)], 1e-9);
}

template <typename F>
double seconds_of(const F& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A profile by sequences: the largest count, after checking the arguments.
int64_t most_sequences(const char* what, std::span<const int64_t> sequences, int64_t context, int repeats) {
  if (sequences.empty() || repeats < 1 || context < 1)
    fail(what, "sequence counts, a context of 1 token or more and one repeat or more",
         std::to_string(sequences.size()) + " counts, " + std::to_string(context) + " tokens, " + std::to_string(repeats) + " repeats");
  const int64_t most = *std::max_element(sequences.begin(), sequences.end());
  if (most < 1) fail(what, "sequence counts of 1 or more", std::to_string(most));
  return most;
}

// `n` sequences, each after its context of `zeros` (a call each: a prompt's size); with
// `drafting`, its features in its drafter windows too (a speculating session's way).
std::vector<std::unique_ptr<Sequence>> with_context(Executor& executor, int64_t n, const Zeros& zeros, bool drafting) {
  std::vector<std::unique_ptr<Sequence>> seqs;
  for (int64_t i = 0; i < n; ++i) {
    seqs.push_back(executor.new_sequence());
    BatchItem item = zeros.item(*seqs.back(), int64_t(zeros.tokens.size()));
    item.drafter_context = drafting;
    executor.forward_batch({item});
  }
  return seqs;
}

}  // namespace

StepRate measure_step_rate(Executor& executor, std::span<const int64_t> rows, int64_t context, int repeats) {
  if (rows.empty() || repeats < 1) fail("measure_step_rate", "row counts and one repeat or more", "none");
  const int64_t most = *std::max_element(rows.begin(), rows.end());
  const Zeros zeros(executor.model().config(), std::max(most, context));
  const std::unique_ptr<Sequence> seq = executor.new_sequence();
  if (context > 0) executor.forward_batch({zeros.item(*seq, context)});
  ForwardOptions all_logits;
  all_logits.all_logits = true;
  std::vector<StepRate::Point> points;
  for (const int64_t n : rows)
    points.push_back({n, median_rate(repeats, [&] {
                        const SequenceMark mark = executor.mark(*seq, n);
                        const double t = seconds_of([&] { executor.forward_batch({zeros.item(*seq, n, all_logits)}); });
                        executor.rewind(*seq, mark);
                        return t;
                      })});
  return StepRate(points);
}

StepRate measure_plain_rate(Executor& executor, std::span<const int64_t> sequences, int64_t context, int repeats) {
  const int64_t most = most_sequences("measure_plain_rate", sequences, context, repeats);
  const Config& c = executor.model().config();
  const Zeros zeros(c, context);
  const std::vector<std::unique_ptr<Sequence>> seqs = with_context(executor, most, zeros, false);
  SampleRequest greedy;
  greedy.vocab = c.vocab_size;
  std::vector<TokenChoice> choices(static_cast<size_t>(most));
  std::vector<StepRate::Point> points;
  for (const int64_t n : sequences) {
    std::vector<BatchItem> items;
    for (int64_t i = 0; i < n; ++i) {
      items.push_back(zeros.item(*seqs[size_t(i)], 1));
      items.back().sample = &greedy, items.back().choice = &choices[size_t(i)];
    }
    points.push_back({n, median_rate(repeats, [&] {
                        std::vector<SequenceMark> marks;
                        for (int64_t j = 0; j < n; ++j) marks.push_back(executor.mark(*seqs[size_t(j)], 1));
                        const double t = seconds_of([&] { executor.forward_batch(items); });
                        for (int64_t j = 0; j < n; ++j) executor.rewind(*seqs[size_t(j)], marks[size_t(j)]);
                        return t;
                      })});
  }
  return StepRate(points);
}

StepRate measure_draft_rate(Executor& executor, std::span<const int64_t> sequences, int64_t context, int repeats) {
  const int64_t most = most_sequences("measure_draft_rate", sequences, context, repeats);
  const std::vector<std::unique_ptr<Sequence>> seqs = with_context(executor, most, Zeros(executor.model().config(), context), true);
  std::vector<StepRate::Point> points;
  for (const int64_t n : sequences) {
    std::vector<DraftRequest> requests;
    for (int64_t i = 0; i < n; ++i) requests.push_back(DraftRequest{seqs[size_t(i)].get(), 0});
    // A draft changes nothing in its sequence: no rewind.
    points.push_back({n, median_rate(repeats, [&] { return seconds_of([&] { executor.dspark_drafts(requests); }); })});
  }
  return StepRate(points);
}

std::vector<double> prefix_survival(std::span<const float> confidence) {
  std::vector<double> a;
  a.reserve(confidence.size());
  double survival = 1;
  for (const float z : confidence) {
    survival *= 1 / (1 + std::exp(-double(z)));
    a.push_back(survival);
  }
  return a;
}

namespace {

// The rule of prefix_schedule.h: the drafts in decreasing survival, the prefix of that order with
// the highest expected tokens per second. `outside(n)` is the step's time outside the verification
// pass when n sequences draft; `outside_tokens` its tokens there. With `all_in_pass` every listed
// sequence is a row of the pass (its lengths chosen after drafting), else only those with a draft
// taken (whether to draft: the others are priced in `outside`). With `redo` a rejection costs the
// pass that runs the anchor and the accepted drafts again. Returns each sequence's length.
template <typename Outside>
std::vector<int> best_prefix(std::span<const std::vector<double>> survival, const StepRate& sps, const Outside& outside,
                             int64_t outside_tokens, bool all_in_pass, bool redo) {
  struct Draft {
    double a;
    int r, k;  // draft k (from 1) of sequence r
  };
  std::vector<Draft> drafts;
  for (size_t r = 0; r < survival.size(); ++r)
    for (size_t k = 0; k < survival[r].size(); ++k) {
      const double a = survival[r][k];
      if (!(a >= 0 && a <= 1)) fail("verification lengths", "survival probabilities in [0, 1]", std::to_string(a));
      if (k > 0 && a > survival[r][k - 1])
        fail("verification lengths", "survival that never grows along a draft", std::to_string(a) + " after " + std::to_string(survival[r][k - 1]));
      drafts.push_back({a, int(r), int(k) + 1});
    }
  // Decreasing survival; among equals a sequence's drafts in order, so each is taken after the one before it.
  std::stable_sort(drafts.begin(), drafts.end(), [](const Draft& x, const Draft& y) { return x.a > y.a; });
  std::vector<int> length(survival.size(), 0);
  const int64_t R = int64_t(survival.size());
  if (R == 0) return length;
  // The redo: its chance, 1 − Π_r a_{r,ℓ_r} (every verified draft accepted: none), and its
  // expected rows, Σ_r Σ_{j<ℓ_r} (1 + j)(a_{r,j} − a_{r,j+1}) (a_{r,0} = 1: rejected at draft j + 1,
  // the anchor and j drafts run again); its time taken at the rows it has when it comes.
  std::vector<double> last(survival.size(), 1.0);  // a_{r,ℓ_r}
  double all_accepted = 1, redo_rows = 0;
  const auto seconds = [&](int64_t rows, int64_t drafting) {
    double t = outside(drafting) + (rows > 0 ? 1 / sps.at(rows) : 0.0);
    const double p = 1 - all_accepted;
    if (redo && p > 1e-12) t += p / sps.at(std::max<int64_t>(1, std::llround(redo_rows / p)));
    return t;
  };
  // The whole order is scanned: the drafting time steps up with each new sequence, the redo's with
  // the first draft that may be rejected, the batch's pass steps down as a sequence leaves it, and
  // a measured profile need not be convex, so a prefix past one that lowers the rate may still be
  // the best.
  int64_t rows = all_in_pass ? R : 0, drafting = 0;
  double tokens = double(R + outside_tokens);  // expected tokens: each sequence's own, then its accepted drafts
  double best = tokens / seconds(rows, drafting);
  size_t best_end = 0;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const Draft& d = drafts[i];
    double& before = last[size_t(d.r)];
    redo_rows += double(d.k) * (before - d.a);
    all_accepted = before > 0 ? all_accepted / before * d.a : 0;  // (before = 0: already 0)
    before = d.a;
    tokens += d.a, rows += 1;
    if (d.k == 1) drafting += 1, rows += all_in_pass ? 0 : 1;  // a sequence drafting: its anchor's row joins the pass
    const double rate = tokens / seconds(rows, drafting);
    if (rate > best) best = rate, best_end = i + 1;
  }
  for (size_t i = 0; i < best_end; ++i) length[size_t(drafts[i].r)] = drafts[i].k;
  return length;
}

}  // namespace

std::vector<int> verification_lengths(std::span<const std::vector<double>> survival, const StepRate& sps, const StepCost& cost) {
  if (!(cost.seconds_outside >= 0) || !std::isfinite(cost.seconds_outside) || cost.tokens_outside < 0)
    fail("verification lengths", "a time outside the pass of 0 s or more and 0 tokens or more there",
         std::to_string(cost.seconds_outside) + " s, " + std::to_string(cost.tokens_outside) + " tokens");
  return best_prefix(survival, sps, [&](int64_t) { return cost.seconds_outside; }, cost.tokens_outside, true, cost.redo);
}

std::vector<bool> drafting_sequences(std::span<const std::vector<double>> estimated, const StepRate& plain, const StepRate& sps,
                                     const StepRate& draft, bool redo) {
  const int64_t R = int64_t(estimated.size());
  const auto outside = [&](int64_t n) { return (n < R ? 1 / plain.at(R - n) : 0.0) + (n > 0 ? 1 / draft.at(n) : 0.0); };
  const std::vector<int> length = best_prefix(estimated, sps, outside, 0, false, redo);
  std::vector<bool> drafts(length.size());
  for (size_t r = 0; r < length.size(); ++r) drafts[r] = length[r] > 0;
  return drafts;
}

SurvivalEstimate::SurvivalEstimate(int block, const DraftingPolicy& policy) : policy_(policy) {
  const DraftingPolicy& p = policy;
  if (block < 1 || !(p.prior >= 0 && p.prior <= 1) || !(p.prior_weight > 0) || !std::isfinite(p.prior_weight) ||
      !(p.decay > 0 && p.decay < 1) || p.reprobe_after < 1)
    fail("drafting policy", "a block of 1 or more, prior in [0, 1], prior_weight > 0, decay in (0, 1), reprobe_after >= 1",
         std::to_string(block) + ", " + std::to_string(p.prior) + ", " + std::to_string(p.prior_weight) + ", " +
             std::to_string(p.decay) + ", " + std::to_string(p.reprobe_after));
  sum_.resize(size_t(block));
  survival_.resize(size_t(block));
  start();
}

void SurvivalEstimate::start() {
  weight_ = policy_.prior_weight;
  double a = 1;
  for (size_t k = 0; k < survival_.size(); ++k) {
    a *= policy_.prior;
    survival_[k] = a;
    sum_[k] = weight_ * a;
  }
  plain_run_ = 0;
}

void SurvivalEstimate::drafted(std::span<const double> survival, int verified, int accepted) {
  const int G = int(survival_.size());
  if (int(survival.size()) != G || verified < 0 || verified > G || accepted < 0 || accepted > verified)
    fail("survival estimate", std::to_string(G) + " survivals and 0 <= accepted <= verified <= " + std::to_string(G),
         std::to_string(survival.size()) + " survivals, " + std::to_string(accepted) + " of " + std::to_string(verified) + " accepted");
  // The confidence head's survival given the first `verified` drafts accepted (0 where it gave those none).
  const double given = verified == 0 ? 1.0 : survival[size_t(verified) - 1];
  weight_ = policy_.decay * weight_ + 1;
  for (int k = 1; k <= G; ++k) {
    double o;
    if (k <= verified) o = k <= accepted ? 1 : 0;
    else if (accepted < verified) o = 0;
    else o = given > 0 ? std::clamp(survival[size_t(k) - 1] / given, 0.0, 1.0) : 0;
    sum_[size_t(k) - 1] = policy_.decay * sum_[size_t(k) - 1] + o;
    survival_[size_t(k) - 1] = std::min(sum_[size_t(k) - 1] / weight_, 1.0);
  }
  plain_run_ = 0;
}

void SurvivalEstimate::plain() {
  if (++plain_run_ >= policy_.reprobe_after) start();
}

}  // namespace dsv41
