#pragma once
// Choosing the next token from logits on the CPU: greedy, or temperature sampling restricted by
// top-k, top-p and min-p (model/sampling.h). A Sampler owns its random stream, so the same seed and
// the same logits give the same tokens.
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "model/sampling.h"

namespace dsv41 {

// What sampling (temperature > 0) draws from: the candidates by descending logit (ties: the lower
// id first), of which top-k, then min-p and top-p keep a prefix, with their probabilities (softmax
// at the temperature over the top-k), and the prefix's mass. Token ids[i] is drawn with
// probability p[i] / mass.
struct Candidates {
  std::vector<int> ids;
  std::vector<double> p;
  double mass = 0;
  // The candidate at the point u in [0, 1) of the mass (the last one where rounding leaves u past it).
  int at(double u) const;
  // The probability of token t (0 if it is not a candidate).
  double probability(int t) const;
};
Candidates candidates(const float* logits, const SamplingParams& params, int64_t vocab);

// Greedy: the first maximum. Sampling: the candidate at u (Candidates::at). Of the row after the
// request's edits and mask (disallowed tokens at -inf).
TokenChoice choose(const float* logits, const SampleRequest& request);

// The logprobs choose() reports, of a given token: the log-softmax of the row's first `vocab`
// logits at `token`, and the `top` most likely tokens' (best first, ties to the lower id; -inf
// ones left out). Prompt logprobs score each prompt token so.
TokenChoice score(const float* logits, int64_t vocab, int token, int top);

class Sampler {
 public:
  // Refuses parameters out of range (and logit_bias ids outside [0, vocab) when vocab > 0), naming them.
  explicit Sampler(const SamplingParams& params, int64_t vocab = 0);
  const SamplingParams& params() const { return params_; }
  // The next row's point in [0, 1): a draw from the stream when sampling, 0 (no draw) when greedy.
  double draw();
  // What the penalties count: a reply's prompt (the repetition penalty's; the counts of an earlier
  // reply are dropped), then each token chosen after it (all three penalties').
  void start_reply(std::span<const int> prompt);
  void chose(int token);
  // The next row's edits: logit_bias and the penalties over the tokens counted so far, by token id.
  std::vector<LogitEdit> edits() const;
  // A restriction of the tokens (a grammar): its mask goes with each request, and each token
  // chosen advances it. Null: none.
  void constrain(std::shared_ptr<TokenConstraint> constraint) { constraint_ = std::move(constraint); }
  const TokenConstraint* constraint() const { return constraint_.get(); }
  // The next row's request: a draw, the edits and the constraint's mask.
  SampleRequest request(int64_t vocab, int top_logprobs = -1);
  // Chooses from a row and counts the choice.
  int sample(const float* logits, int64_t vocab);

 private:
  LogitEdit& edit(int token);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::map<int, LogitEdit> edits_;  // every token with an edit (none while the parameters edit nothing)
  std::map<int, int> counts_;       // the reply's tokens so far
  std::shared_ptr<TokenConstraint> constraint_;
};

}  // namespace dsv41
