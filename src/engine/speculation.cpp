#include "engine/speculation.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"

namespace dsv41 {

namespace {

void check_rows(std::span<const float> target, const Draft& draft, int64_t vocab, bool logits) {
  const int64_t G = int64_t(draft.tokens.size()) - 1;
  if (G < 0 || int64_t(target.size()) != (G + 1) * vocab)
    fail("verify", std::to_string(G + 1) + " target rows of " + std::to_string(vocab) + " logits", std::to_string(target.size()) + " values");
  if (logits && int64_t(draft.logits.size()) != G * vocab)
    fail("verify", std::to_string(G) + " draft rows of " + std::to_string(vocab) + " logits", std::to_string(draft.logits.size()) + " values");
}

// A dense [vocab] vector of a candidate set's probabilities.
std::vector<double> dense(const Candidates& c, int64_t vocab) {
  std::vector<double> out(static_cast<size_t>(vocab), 0.0);
  for (size_t i = 0; i < c.ids.size(); ++i) out[size_t(c.ids[i])] = c.p[i] / c.mass;
  return out;
}

}  // namespace

Verifier::Verdict Verifier::verify_choices(std::span<const int>, const Draft&) {
  fail("verify", "target rows for a verifier that reads them (row_choice: none)", "the rows' choices only");
}

GreedyVerifier::GreedyVerifier(int64_t vocab, int64_t sampled) : vocab_(vocab) { argmax_.vocab = sampled; }

Verifier::Verdict GreedyVerifier::verify(std::span<const float> target, const Draft& draft) {
  check_rows(target, draft, vocab_, false);
  std::vector<int> choices;
  for (size_t k = 0; k < draft.tokens.size(); ++k) choices.push_back(draft_argmax(target.subspan(k * size_t(vocab_), size_t(argmax_.vocab))));
  return verify_choices(choices, draft);
}

Verifier::Verdict GreedyVerifier::verify_choices(std::span<const int> target, const Draft& draft) {
  const int64_t G = int64_t(draft.tokens.size()) - 1;
  if (int64_t(target.size()) != G + 1)
    fail("verify", std::to_string(G + 1) + " target choices", std::to_string(target.size()));
  Verdict v;
  v.token = target[0];
  while (v.accepted < G && v.token == draft.tokens[size_t(v.accepted) + 1]) v.token = target[size_t(++v.accepted)];
  return v;
}

SamplingVerifier::SamplingVerifier(Sampler& sampler, int64_t vocab, int64_t sampled)
    : sampler_(sampler), vocab_(vocab), sampled_(sampled) {
  if (!(sampler.params().temperature > 0))
    fail("SamplingVerifier", "a sampling temperature above 0 (greedy speculation is GreedyVerifier's)", std::to_string(sampler.params().temperature));
}

int SamplingVerifier::draft(std::span<const float> logits) {
  return candidates(logits.data(), sampler_.params(), sampled_).at(sampler_.draw());
}

Verifier::Verdict SamplingVerifier::verify(std::span<const float> target, const Draft& draft) {
  check_rows(target, draft, vocab_, true);
  const SamplingParams& params = sampler_.params();
  const int64_t G = int64_t(draft.tokens.size()) - 1;
  Verdict v;
  for (; v.accepted < G; ++v.accepted) {
    const int d = draft.tokens[size_t(v.accepted) + 1];
    const Candidates p = candidates(target.data() + v.accepted * vocab_, params, sampled_);
    const Candidates q = candidates(draft.logits.data() + v.accepted * vocab_, params, sampled_);
    const double pd = p.probability(d), qd = q.probability(d);
    if (qd > 0 && sampler_.draw() < std::min(1.0, pd / qd)) continue;
    // Rejected: the residual max(0, p − q), renormalized; p's candidates are its support.
    const std::vector<double> qs = dense(q, sampled_);
    Candidates residual;
    for (size_t i = 0; i < p.ids.size(); ++i) {
      const double r = p.p[i] / p.mass - qs[size_t(p.ids[i])];
      if (r <= 0) continue;
      residual.ids.push_back(p.ids[i]);
      residual.p.push_back(r);
      residual.mass += r;
    }
    v.token = residual.mass > 0 ? residual.at(sampler_.draw()) : p.at(sampler_.draw());
    return v;
  }
  v.token = candidates(target.data() + G * vocab_, params, sampled_).at(sampler_.draw());
  return v;
}

}  // namespace dsv41
