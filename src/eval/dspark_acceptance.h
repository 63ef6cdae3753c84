#pragma once
// DSpark's acceptance on validation text (docs/eval.md): a validation sequence's prompt served in
// the mode asked with drafting on, then greedy speculative decoding (Session::speculate with the
// greedy verifier, the served path): how many of each step's drafts the target accepted.
#include <memory>
#include <span>
#include <vector>

#include "engine/session.h"

namespace dsv41::eval {

struct Acceptance {
  int64_t steps = 0;     // verification passes
  int64_t accepted = 0;  // draft tokens accepted, over all steps
  int64_t emitted = 0;   // tokens emitted by the steps (accepted + the target's own, one per step)
  std::vector<int64_t> accepted_at;  // [k]: steps that accepted at least k + 1 drafts
  void add(const Acceptance& other);
};

// `prompt` in one prefill call of `mode`, then speculative steps until `tokens` tokens were emitted
// after the prompt's own choice (the last step's may overshoot) or a `stop` id was emitted.
Acceptance dspark_acceptance(Executor& executor, std::shared_ptr<const EngramHasher> hasher, int64_t vocab, Mode mode,
                             std::span<const int> prompt, int64_t tokens, std::span<const int> stop);

}  // namespace dsv41::eval
