#pragma once
// Training of a byte-level BPE model (docs/training-data.md, "Tokenizer"), as Hugging Face's
// BpeTrainer does it: words are pre-tokenized text, each starting as its bytes; the most frequent
// adjacent pair of symbols (counted over all words, each weighted by its count) is merged into a
// new symbol, again and again, until the vocabulary is full or no pair occurs `min_count` times.
// Ties go to the pair with the smaller (left, right) symbol ids, so training is deterministic:
// the same words give the same merges, whatever the order they were counted in.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/tokenizer/pre_tokenizers.h"

namespace dsv41::train {

// Counts the words of texts as the tokenizer will cut them: the added tokens (tokenizer_json.h)
// are taken out first, then the pre-tokenizer of tokenizer_json.h splits the rest. Words are
// kept as their bytes.
class WordCounter {
 public:
  WordCounter();
  void add(std::string_view text);
  // Adds another counter's counts (to count in parallel and join).
  void merge(const WordCounter& other);
  // (word, count) sorted by word.
  std::vector<std::pair<std::string, uint64_t>> words() const;

 private:
  void add_piece(std::string_view text);
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  PreTokenized scratch_;
  std::unordered_map<std::string, uint64_t> counts_;
};

struct BpeModel {
  // Symbol ids: 0..255 are the bytes in byte order; merge k (0-based) made symbol 256 + k unless
  // its text was already a symbol (then `merges[k]` names that older one as its result).
  std::vector<std::string> symbols;  // each symbol's bytes
  struct Merge {
    int left, right, result;
  };
  std::vector<Merge> merges;  // in order: merge k has rank k
};

struct BpeOptions {
  size_t symbols = 8192 - 265;  // the vocabulary's size less the added tokens: bytes + merged symbols
  uint64_t min_count = 2;       // a pair that occurs fewer times is never merged
  // Called now and then with (symbols so far, symbols wanted).
  std::function<void(size_t, size_t)> progress;
};

BpeModel train_bpe(const std::vector<std::pair<std::string, uint64_t>>& words, const BpeOptions& options);

}  // namespace dsv41::train
