#pragma once
// One sequence being served: its KV state, its Engram history, and the tokenizer-derived Engram
// vocabulary, so that callers feed token ids (a prompt chunk, then one token at a time) and get
// logits back. Exact mode (DESIGN §3): every layer on every position.
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "forward/forward.h"
#include "model/engram_hash.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

class Session {
 public:
  // `tokenizer` may be null for a model without Engram; Engram hashes over the compressed
  // vocabulary that the tokenizer defines, so a model with Engram needs it.
  Session(const Model& model, const Tokenizer* tokenizer);

  // Runs `tokens` at the next positions; returns the logits of the last one.
  std::vector<float> run(std::span<const int> tokens);
  int64_t length() const { return state_.length; }
  const SequenceState& state() const { return state_; }

 private:
  const Model& model_;
  SequenceState state_;
  std::optional<EngramHasher> hasher_;
  EngramHistory history_;
};

}  // namespace dsv41
