#pragma once
// The passkey retrieval probe (docs/eval.md): a random 5-digit key stated once at a random depth of
// a long filler text, then asked for; the model's greedy reply is correct when its first run of
// digits is the key. Plain text through the model's tokenizer, no chat template:
//
//   <BOS>There is a pass key hidden in the text below. Find it and remember it.\n\n
//   {filler up to the depth} The pass key is {KEY}. Remember it. {KEY} is the pass key.{rest of the filler}
//   \n\nWhat is the pass key? The pass key is
//
// Each part is encoded on its own and the ids joined; the filler's tokens are cut to make the prompt
// exactly the length asked.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/session.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41::eval {

inline constexpr std::string_view kPasskeyHead = "There is a pass key hidden in the text below. Find it and remember it.\n\n";
inline constexpr std::string_view kPasskeyQuestion = "\n\nWhat is the pass key? The pass key is";
std::string passkey_needle(const std::string& key);  // " The pass key is KEY. Remember it. KEY is the pass key."

// One trial's key (5 digits, 10000 to 99999) and depth (in [0, 1)), drawn from (seed, length, trial)
// alone by SplitMix64, the same on every machine.
struct PasskeyTrial {
  std::string key;
  double depth = 0;
};
PasskeyTrial passkey_trial(uint64_t seed, int64_t length, int trial);

struct PasskeyPrompt {
  std::vector<int> ids;              // exactly the length asked
  int64_t needle_begin = 0, needle_end = 0;  // the needle's ids are ids[needle_begin, needle_end)
  int64_t filler_tokens = 0;         // filler ids in the prompt, before and after the needle
  int64_t filler_before = 0;         // of them before the needle
};

// The prompt of `length` ids with the needle after round(depth × F) of its F filler ids, moved
// forward to the next sentence end (a filler id whose text ends in '.', '!', '?' or a newline) when
// one is within 64 ids, so that the needle starts a sentence. `filler` (the filler text's ids) is
// repeated as often as needed. Throws dsv41::Error when `length` leaves no room for the filler.
PasskeyPrompt passkey_prompt(const Tokenizer& tokenizer, std::span<const int> filler, int64_t length, const std::string& key,
                             double depth);

// The shortest length passkey_prompt takes for `key` (its head, needle and question, one filler id).
int64_t passkey_min_length(const Tokenizer& tokenizer, const std::string& key);

// Whether `reply` (the generated text) answers `key`: its first run of ASCII digits is the key.
bool passkey_correct(std::string_view reply, std::string_view key);

// The model's greedy reply to `prompt` served in `mode` (one prefill call, then decode steps; the
// first maximum of each row's logits over sampling_vocab's ids), at most `max_tokens` ids, ending
// early at a `stop` id (not kept). `text` is the reply decoded, special tokens left out.
struct PasskeyReply {
  std::vector<int> ids;
  std::string text;
};
PasskeyReply passkey_reply(Executor& executor, std::shared_ptr<const EngramHasher> hasher, const Tokenizer& tokenizer, Mode mode,
                           std::span<const int> prompt, int max_tokens, std::span<const int> stop);

}  // namespace dsv41::eval
