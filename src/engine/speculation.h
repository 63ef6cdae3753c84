#pragma once
// How a speculative step chooses (issue 18; Leviathan et al. 2023, "Fast Inference from
// Transformers via Speculative Decoding"; reference notes components.md §6.3): the drafter's token
// at each draft position, and the verdict on a draft from the target's rows. Session::speculate
// runs the step; a verifier decides.
#include <cstdint>
#include <span>

#include "backend/cpu/sampling.h"
#include "forward/dspark.h"

namespace dsv41 {

class Verifier {
 public:
  virtual ~Verifier() = default;
  // The draft token from one draft row (DSpark's Markov-corrected logits, the model's vocabulary).
  virtual int draft(std::span<const float> logits) = 0;
  // Whether draft() is draft_argmax and verify() reads no draft logits: the executor may then
  // choose the drafts where it holds the rows (DraftRequest without `choose`).
  virtual bool greedy() const { return false; }
  // From the target's rows [γ + 1, vocab] (row k follows draft token k) and the draft (its tokens
  // [anchor, d_1 .. d_γ], and its logits where the rule reads them): how many drafts are accepted,
  // and the token emitted after them.
  struct Verdict {
    int accepted = 0;
    int token = 0;
  };
  virtual Verdict verify(std::span<const float> target, const Draft& draft) = 0;
  // Where the verdict reads only each target row's choice (greedy): the choice, for the executor to
  // make on every row of the pass itself (BatchItem::sample), and the verdict from those tokens
  // [γ + 1]. Null: verify reads the rows.
  virtual const SampleRequest* row_choice() const { return nullptr; }
  virtual Verdict verify_choices(std::span<const int> target, const Draft& draft);
};

// Greedy: a draft is DSpark's first maximum; d_k is accepted while it is the target's choice at row
// k − 1 (the first maximum among the `sampled` ids, as a greedy Sampler chooses), then the target's
// choice is emitted. The tokens are plain greedy decoding's.
class GreedyVerifier final : public Verifier {
 public:
  GreedyVerifier(int64_t vocab, int64_t sampled);
  int draft(std::span<const float> logits) override { return draft_argmax(logits); }
  bool greedy() const override { return true; }
  Verdict verify(std::span<const float> target, const Draft& draft) override;
  const SampleRequest* row_choice() const override { return &argmax_; }
  Verdict verify_choices(std::span<const int> target, const Draft& draft) override;

 private:
  int64_t vocab_;
  SampleRequest argmax_;  // temperature 0 over the sampled ids
};

// Speculative sampling: drafts are drawn from the sampler's candidates q of the draft rows (its
// temperature, top-k, top-p and min-p, over the `sampled` ids); d_k is accepted with probability
// min(1, p(d_k) / q(d_k)), p the candidates of the target's row k − 1; at the first rejection a
// token is drawn from norm(max(0, p − q)) (from p where that has no mass); after all γ, one from
// the target's row γ. Every emitted token is distributed as plain sampling's (the theorem of
// Leviathan et al.); the draws come from the sampler's stream, so a seed gives one output.
class SamplingVerifier final : public Verifier {
 public:
  // Refuses a greedy sampler (GreedyVerifier is its rule).
  SamplingVerifier(Sampler& sampler, int64_t vocab, int64_t sampled);
  int draft(std::span<const float> logits) override;
  Verdict verify(std::span<const float> target, const Draft& draft) override;

 private:
  Sampler& sampler_;
  int64_t vocab_, sampled_;
};

}  // namespace dsv41
