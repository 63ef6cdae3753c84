#include "engine/prefix_schedule.h"

#include <algorithm>
#include <chrono>
#include <cmath>
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

StepRate measure_step_rate(Executor& executor, std::span<const int64_t> rows, int64_t context, int repeats) {
  if (rows.empty() || repeats < 1) fail("measure_step_rate", "row counts and one repeat or more", "none");
  const Config& c = executor.model().config();
  const int64_t engram_per_token = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
  // Token ids and Engram rows do not change a pass's work: zeros.
  const auto run = [&](Sequence& seq, int64_t n, bool all_logits) {
    const std::vector<int> tokens(size_t(n), 0);
    const std::vector<int64_t> engram(size_t(n * engram_per_token), 0);
    ForwardOptions options;
    options.all_logits = all_logits;
    executor.forward_batch({BatchItem{&seq, tokens, engram_per_token > 0 ? engram.data() : nullptr, options}});
  };
  const std::unique_ptr<Sequence> seq = executor.new_sequence();
  if (context > 0) run(*seq, context, false);
  std::vector<StepRate::Point> points;
  for (const int64_t n : rows) {
    std::vector<double> seconds;
    for (int i = 0; i < repeats; ++i) {
      const SequenceMark mark = executor.mark(*seq, n);
      const auto t0 = std::chrono::steady_clock::now();
      run(*seq, n, true);
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      executor.rewind(*seq, mark);
    }
    std::nth_element(seconds.begin(), seconds.begin() + repeats / 2, seconds.end());
    points.push_back({n, 1 / std::max(seconds[size_t(repeats / 2)], 1e-9)});
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

std::vector<int> verification_lengths(std::span<const std::vector<double>> survival, const StepRate& sps) {
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
  int64_t rows = R;
  double tokens = double(R);  // expected tokens of the step: each sequence's own, then its accepted drafts
  double best = tokens * sps.at(rows);
  for (const Draft& d : drafts) {
    const double rate = (tokens + d.a) * sps.at(rows + 1);
    if (!(rate > best)) break;
    best = rate, tokens += d.a, rows += 1;
    length[size_t(d.r)] = d.k;
  }
  return length;
}

}  // namespace dsv41
