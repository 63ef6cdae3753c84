#pragma once
// One sequence being served: its KV state, its Engram history, and the tokenizer-derived Engram
// vocabulary, so that callers feed token ids (a prompt, then one token at a time) and get logits
// back. Default mode runs the report's decoder bounded replay on every prompt; exact mode runs
// every layer on every position, as the official reference does (DESIGN §3).
#include <optional>
#include <span>
#include <vector>

#include "forward/forward.h"
#include "model/engram_hash.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

enum class Mode { Exact, Default };

class Session {
 public:
  // `tokenizer` may be null for a model without Engram; Engram hashes over the compressed
  // vocabulary that the tokenizer defines, so a model with Engram needs it.
  Session(const Model& model, const Tokenizer* tokenizer, Mode mode = Mode::Default);

  // A prompt (or the next turn's input). In default mode the decoder layers run on its last
  // min(W, tokens) positions only, their windows truncated there. Returns the last logits.
  std::vector<float> prefill(std::span<const int> tokens);
  // One token at the next position, through every layer. Returns its logits.
  std::vector<float> decode(int token);
  // Continues a sequence whose state comes from the KV tiers (kv/sequence_blocks.h): `tokens`
  // are all the tokens that state holds; the Engram history is rebuilt from them.
  void resume(std::span<const int> tokens, SequenceState state);

  // Tokens run through the encoder and through the decoder layers so far: the work bounded
  // replay saves is the difference between the two.
  struct Work {
    int64_t encoder_tokens = 0, decoder_tokens = 0;
  };
  const Work& work() const { return work_; }
  Mode mode() const { return mode_; }
  int64_t length() const { return state_.length; }
  const SequenceState& state() const { return state_; }

 private:
  std::vector<float> run(std::span<const int> tokens, int64_t decoder_from);

  const Model& model_;
  Mode mode_;
  SequenceState state_;
  std::optional<EngramHasher> hasher_;
  EngramHistory history_;
  Work work_;
};

}  // namespace dsv41
