#pragma once
// Engram n-gram hashing, exactly as the reference inference/engram.py computes it (docs/engram.md).
//
// Each position t is hashed with the max_ngram_size - 1 tokens before it: tokens go through the
// compressed vocabulary (the token map), get multiplied by per-layer odd multipliers drawn
// with NumPy's generator, and are XOR-folded one look-back at a time; after folding in look-back
// k the value is reduced modulo the prime of each (order k + 1, head) column and shifted by that
// column's row offset, giving a global row of the layer's table. Look-back stops at the start of
// the sequence and at image tokens ("sticky": beyond such a slot every slot takes the pad id).
#include <cstdint>
#include <span>
#include <vector>

#include "model/config.h"

namespace dsv41 {

// The reference's compute_hash_multipliers for one layer: r = default_rng(10007 * layer_id)
// .integers(0, bound, size=max_ngram_size, dtype=int64) with bound = max(1, (INT64_MAX //
// compressed_vocab_size) // 2), returned as 2r + 1 (odd, and small enough that id * multiplier
// cannot overflow int64 for any compressed id).
std::vector<int64_t> engram_multipliers(int layer_id, int max_ngram_size, int64_t compressed_vocab_size);

// A sequence's look-back for the hasher: the compressed ids of its last positions, oldest first,
// at most max_ngram_size - 1 of them (fewer only near the start of the sequence), with
// EngramHistory::kImage where that position was an image token. A default-constructed history is
// an empty sequence. Hashing a prompt in one call or in chunks of any size gives the same ids as
// long as the same history object is passed along.
struct EngramHistory {
  static constexpr int32_t kImage = -1;  // the reference caches such positions as DEAD
  std::vector<int32_t> recent;
};

class EngramHasher {
 public:
  // `token_map` maps every raw token id (the tokenizer's full vocabulary, added tokens included)
  // to its compressed id. Throws dsv41::Error when the config has no Engram layers, when the map's
  // ids are not exactly 0..engram_compressed_vocab_size-1, or when engram_pad_id has no entry.
  EngramHasher(const Config& config, std::vector<int32_t> token_map);

  int n_layers() const { return int(multipliers_.size()); }  // Engram layers, in engram_layer_ids order
  int columns() const { return columns_; }                   // hash ids per position and layer
  int32_t pad_id() const { return pad_id_; }  // compressed id of engram_pad_id
  // Per Engram layer `index` (into engram_layer_ids): max_ngram_size odd multipliers, and per
  // column (order-major, then head) its prime and its first row in the layer's table.
  const std::vector<int64_t>& multipliers(int index) const { return multipliers_.at(index); }
  const std::vector<int64_t>& primes(int index) const { return primes_.at(index); }
  const std::vector<int64_t>& offsets(int index) const { return offsets_.at(index); }

  // Hashes `tokens` (raw ids), the positions that follow `history`, and advances `history` past
  // them. `is_image` is empty (text only) or one flag per token: nonzero marks an image-span
  // position, which takes no part in any n-gram. Writes out[t][layer][column] for every token,
  // n_layers() * columns() ids per token. Throws dsv41::Error on a token outside the map.
  void hash(std::span<const int> tokens, std::span<const uint8_t> is_image, EngramHistory& history,
            int64_t* out) const;

  // The history after the whole sequence `tokens` (with `is_image` as for hash()), without
  // hashing it: for resuming a sequence from its tokens, e.g. after rejected draft tokens.
  EngramHistory history_after(std::span<const int> tokens, std::span<const uint8_t> is_image) const;

 private:
  int32_t compressed(int token, bool image) const;

  int max_ngram_size_ = 0;
  int n_heads_ = 0;
  int columns_ = 0;
  std::vector<int32_t> token_map_;
  int32_t pad_id_ = 0;
  std::vector<std::vector<int64_t>> multipliers_, primes_, offsets_;
};

}  // namespace dsv41
