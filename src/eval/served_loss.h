#pragma once
// The served validation loss (docs/eval.md): a validation sequence served as a request is — its
// prompt in one prefill call of the mode asked, then the rest teacher-forced through the engine's
// decode steps — scored by the logits the engine produced; and the same tokens' loss from one exact
// pass with every row's logits, the loss a trainer measures.
#include <memory>
#include <span>
#include <vector>

#include "engine/session.h"
#include "forward/executor.h"
#include "model/engram_hash.h"

namespace dsv41::eval {

// -log softmax(logits)[target] over all of `logits` (the model's vocab_size rows, as the trainer's
// cross-entropy), natural log, in double: max-subtracted log-sum-exp.
double token_nll(std::span<const float> logits, int target);

struct ServedNll {
  std::vector<double> nll;      // of seq[P], seq[P + 1], ..., seq[L]: the continuation
  int64_t decoder_prompt_tokens = 0;  // prompt positions the decoder layers ran (P exact, min(W, P) default)
};

// `seq` holds L + 1 tokens: seq[0, P) is the prompt, run by one Session::prefill in `mode`; its last
// logits score seq[P]; then seq[P], ..., seq[L - 1] are decoded one by one (Session::decode, the
// served decode path), each step's logits scoring the next token. L + 1 - P scores.
ServedNll served_nll(Executor& executor, std::shared_ptr<const EngramHasher> hasher, Mode mode, std::span<const int> seq,
                     int64_t prompt);

// seq[0, L) in one exact-mode prompt with every row's logits (Session::begin_prompt with
// prompt_logits: all rows but the last in one call, the last row in a second, which equals one call
// to the bit, docs/forward.md "Slot order and chunking"); element i is the NLL of seq[i + 1].
std::vector<double> one_pass_nll(Executor& executor, std::shared_ptr<const EngramHasher> hasher, std::span<const int> seq);

}  // namespace dsv41::eval
