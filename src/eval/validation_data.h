#pragma once
// The validation split of a `dsv41 data build` directory (docs/training-data.md) as `dsv41 eval`
// reads it: validation.tokens (the packed tokens the served loss scores) and validation.jsonl (the
// documents' text, the passkey probe's filler), checked against the model that is evaluated.
#include <span>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/tokenizer/tokenizer.h"
#include "train/data/packed_tokens.h"

namespace dsv41::eval {

struct ValidationData {
  std::string dir;
  train::PackedTokens tokens;      // DIR/validation.tokens
  std::vector<std::string> texts;  // DIR/validation.jsonl's documents in order, when asked for
};

// Reads DIR/validation.tokens, and DIR/validation.jsonl when `texts`. The data must be the model's:
// DIR/tokenizer.json the model's tokenizer (the same token at every id), the packed file's vocabulary
// that tokenizer's size, and so every id below the model's vocab_size. Throws dsv41::Error naming the file, what was expected and what was found.
ValidationData read_validation(const std::string& dir, const Config& config, const Tokenizer& tokenizer, bool texts);

// Whether `data` (read from `where`) is `model`'s tokenizer: the same vocabulary size and the same
// token at every id. Throws dsv41::Error naming the first difference.
void check_same_tokenizer(const Tokenizer& model, const Tokenizer& data, const std::string& where);

// Sequence k of length L in file order (train::SequenceIterator::sequence): tokens [kL, kL + L + 1),
// as ints; the number of whole sequences of `length` in the first `tokens` tokens of the file.
std::vector<int> validation_sequence(const train::PackedTokens& tokens, int64_t length, int64_t k);
int64_t sequences_in(const train::PackedTokens& tokens, int64_t tokens_used, int64_t length);

}  // namespace dsv41::eval
