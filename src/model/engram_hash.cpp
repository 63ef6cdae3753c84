#include "model/engram_hash.h"

#include <algorithm>
#include <limits>
#include <string>

#include "base/error.h"
#include "model/numpy_random.h"

namespace dsv41 {

std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram_size, int64_t compressed_vocab_size) {
  if (layer_id < 0) fail("engram_multipliers", "a layer id >= 0 (it seeds NumPy's generator)", std::to_string(layer_id));
  if (max_ngram_size < 1) fail("engram_multipliers", "max_ngram_size >= 1", std::to_string(max_ngram_size));
  if (compressed_vocab_size < 1)
    fail("engram_multipliers", "a compressed vocabulary size >= 1", std::to_string(compressed_vocab_size));
  // Halving the bound keeps 2r + 1 below INT64_MAX / V, so that id * multiplier fits in int64.
  const int64_t bound = std::max<int64_t>(1, std::numeric_limits<int64_t>::max() / compressed_vocab_size / 2);
  numpy::Pcg64 gen(numpy::SeedSequence(10007 * uint64_t(layer_id)));
  std::vector<int64_t> mult = numpy::integers(gen, 0, bound, size_t(max_ngram_size));
  for (int64_t& m : mult) m = 2 * m + 1;
  return mult;
}

EngramHasher::EngramHasher(const Config& c, std::vector<int32_t> token_map) : token_map_(std::move(token_map)) {
  const std::string where = "Engram hasher (" + (c.source.empty() ? std::string("config") : c.source) + ")";
  if (!c.has_engram()) fail(where, "a config with engram_layer_ids", "none");
  if (c.engram_max_ngram_size < 2 || c.engram_n_heads < 1)
    fail(where, "engram_max_ngram_size >= 2 and engram_n_heads >= 1",
         std::to_string(c.engram_max_ngram_size) + " and " + std::to_string(c.engram_n_heads));
  max_ngram_size_ = c.engram_max_ngram_size;
  n_heads_ = c.engram_n_heads;
  columns_ = c.engram_hash_columns();

  // The reference asserts that its compressed vocabulary has exactly the configured size: every
  // multiplier derives from it, so any other size would silently rehash the whole table.
  const int64_t v = c.engram_compressed_vocab_size;
  std::vector<bool> used(size_t(std::max<int64_t>(v, 0)), false);
  for (size_t id = 0; id < token_map_.size(); ++id) {
    int32_t x = token_map_[id];
    if (x < 0 || x >= v)
      fail(where + ": token map entry " + std::to_string(id), "a compressed id in [0, engram_compressed_vocab_size " +
           std::to_string(v) + ")", std::to_string(x));
    used[size_t(x)] = true;
  }
  int64_t distinct = std::count(used.begin(), used.end(), true);
  if (distinct != v)
    fail(where + ": token map", std::to_string(v) + " distinct compressed ids (engram_compressed_vocab_size)",
         std::to_string(distinct));
  if (c.engram_pad_id < 0 || c.engram_pad_id >= int64_t(token_map_.size()))
    fail(where + ": engram_pad_id", "a token id below the token map's size " + std::to_string(token_map_.size()),
         std::to_string(c.engram_pad_id));
  pad_id_ = token_map_[size_t(c.engram_pad_id)];

  primes_ = engram_primes(c);
  for (size_t i = 0; i < c.engram_layer_ids.size(); ++i) {
    multipliers_.push_back(engram_multipliers(c.engram_layer_ids[i], max_ngram_size_, v));
    // Each column owns the rows [offset, offset + prime) of the layer's table: exclusive prefix sum.
    std::vector<int64_t> offsets(primes_[i].size());
    int64_t row = 0;
    for (size_t col = 0; col < offsets.size(); ++col) {
      offsets[col] = row;
      row += primes_[i][col];
    }
    offsets_.push_back(std::move(offsets));
  }
}

int32_t EngramHasher::compressed(int token, bool image) const {
  // An image position is DEAD whatever its id: image_token_id may lie past the tokenizer's
  // vocabulary (DeepSeek's V3 tokenizer has no <｜deepseek_image｜>), so it is never looked up.
  if (image) return EngramHistory::kImage;
  if (token < 0 || size_t(token) >= token_map_.size())
    fail("Engram hasher: token id", "an id in [0, " + std::to_string(token_map_.size()) + ") (the tokenizer's vocabulary)",
         std::to_string(token));
  return token_map_[size_t(token)];
}

static void check_inputs(std::span<const int> tokens, std::span<const uint8_t> is_image, const EngramHistory& history,
                         int max_ngram_size) {
  if (!is_image.empty() && is_image.size() != tokens.size())
    fail("Engram hasher: is_image", "empty or one flag per token (" + std::to_string(tokens.size()) + ")",
         std::to_string(is_image.size()) + " flags");
  if (history.recent.size() > size_t(max_ngram_size - 1))
    fail("Engram hasher: history", "at most max_ngram_size - 1 (" + std::to_string(max_ngram_size - 1) + ") entries",
         std::to_string(history.recent.size()));
}

void EngramHasher::hash(std::span<const int> tokens, std::span<const uint8_t> is_image, EngramHistory& history,
                        int64_t* out) const {
  check_inputs(tokens, is_image, history, max_ngram_size_);
  // One sequence of compressed ids: the carried look-back, then this chunk.
  std::vector<int32_t> seq = history.recent;
  const int64_t base = int64_t(seq.size());
  for (size_t t = 0; t < tokens.size(); ++t) seq.push_back(compressed(tokens[t], !is_image.empty() && is_image[t]));

  const int n = max_ngram_size_;
  std::vector<int64_t> window(size_t(n), 0);
  for (int64_t t = 0; t < int64_t(tokens.size()); ++t) {
    // window[k] is the id at position t - k. Once a slot reaches before the sequence or onto an
    // image position, it and every farther slot take the pad id: no n-gram spans either.
    bool blocked = false;
    for (int k = 0; k < n; ++k) {
      int64_t src = base + t - k;
      blocked = blocked || src < 0 || seq[size_t(src)] == EngramHistory::kImage;
      window[size_t(k)] = blocked ? pad_id_ : seq[size_t(src)];
    }
    for (int layer = 0; layer < n_layers(); ++layer) {
      const std::vector<int64_t>& mult = multipliers_[size_t(layer)];
      const std::vector<int64_t>& primes = primes_[size_t(layer)];
      const std::vector<int64_t>& offsets = offsets_[size_t(layer)];
      int64_t* row = out + (t * n_layers() + layer) * columns_;
      // Products are non-negative and below INT64_MAX by the multiplier bound, so their XOR is too:
      // the int64 remainders match the reference's torch `%`.
      int64_t h = window[0] * mult[0];
      for (int order = 1; order < n; ++order) {
        h ^= window[size_t(order)] * mult[size_t(order)];
        for (int head = 0; head < n_heads_; ++head) {
          int col = (order - 1) * n_heads_ + head;
          row[col] = h % primes[size_t(col)] + offsets[size_t(col)];
        }
      }
    }
  }
  size_t keep = std::min(seq.size(), size_t(n - 1));
  history.recent.assign(seq.end() - int64_t(keep), seq.end());
}

EngramHistory EngramHasher::history_after(std::span<const int> tokens, std::span<const uint8_t> is_image) const {
  EngramHistory history;
  check_inputs(tokens, is_image, history, max_ngram_size_);
  size_t keep = std::min(tokens.size(), size_t(max_ngram_size_ - 1));
  for (size_t t = tokens.size() - keep; t < tokens.size(); ++t)
    history.recent.push_back(compressed(tokens[t], !is_image.empty() && is_image[t]));
  return history;
}

}  // namespace dsv41
