#pragma once
// Packed token files (docs/training-data.md, "Packed token files"): a split's documents
// tokenized and concatenated, each as BOS, its tokens, EOS; read back as fixed-length sequences.
//
// Layout, little-endian: a 48-byte header, then the tokens as unsigned integers of 2 bytes (when
// every id fits: vocab_size <= 65,536) or 4 bytes.
//   0  "DSV41TOK"      8 bytes, the magic
//   8  version          u32, 1
//  12  bytes per token  u32, 2 or 4
//  16  vocab_size       u32, every token is below it
//  20  eos id           u32
//  24  tokens           u64
//  32  documents        u64 (the number of EOS written by add_document)
//  40  checksum         u64, XXH3-64 (seed 0) of the token bytes
#include <xxhash.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace dsv41::train {

class PackedTokenWriter {
 public:
  // Writes to `path` + ".partial", renamed to `path` by finish().
  PackedTokenWriter(std::string path, uint32_t vocab_size, uint32_t eos_id);

  // Appends a document's ids (BOS first, as the tokenizer's post-processor adds it) and EOS.
  void add_document(std::span<const int> ids);
  // Writes the header and renames the file into place.
  void finish();

 private:
  void append(uint32_t id);
  std::string path_, partial_;
  uint32_t vocab_size_, eos_id_, width_;
  uint64_t tokens_ = 0, documents_ = 0;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash_;
  std::vector<uint8_t> buffer_;  // token bytes not yet written
  std::ofstream out_;
};

// A packed token file, read whole and checked (magic, version, size, every id below vocab_size,
// checksum): a wrong or damaged file is an error naming what was expected and found.
class PackedTokens {
 public:
  static PackedTokens read(const std::string& path);

  uint64_t size() const { return tokens_.size(); }
  uint64_t documents() const { return documents_; }
  uint32_t vocab_size() const { return vocab_size_; }
  uint32_t eos_id() const { return eos_id_; }
  std::span<const uint32_t> tokens() const { return tokens_; }

 private:
  std::vector<uint32_t> tokens_;
  uint64_t documents_ = 0;
  uint32_t vocab_size_ = 0, eos_id_ = 0;
};

// The file cut into sequences for training: sequence k is tokens [k*L, k*L + L + 1) (L inputs,
// and their next tokens as targets, so neighbours share one token); the tail that does not fill
// a sequence is not used. Sequences are visited in epochs, each a permutation of all of them
// drawn from (seed, epoch) alone; `position` counts the sequences handed out since the start
// of epoch 0, so an iterator made with a saved position() continues exactly where it was.
class SequenceIterator {
 public:
  SequenceIterator(const PackedTokens& tokens, uint64_t length, uint64_t seed, uint64_t position = 0);

  uint64_t sequences_per_epoch() const { return count_; }
  uint64_t position() const { return position_; }
  uint64_t epoch() const { return position_ / count_; }
  // The next sequence's L + 1 tokens.
  std::span<const uint32_t> next();
  // Sequence k in file order (for validation, where no shuffling is wanted).
  std::span<const uint32_t> sequence(uint64_t k) const;

 private:
  void draw_epoch(uint64_t epoch);
  const PackedTokens& tokens_;
  uint64_t length_, seed_, count_, position_;
  uint64_t order_epoch_ = ~uint64_t(0);
  std::vector<uint64_t> order_;  // the permutation of epoch order_epoch_
};

}  // namespace dsv41::train
