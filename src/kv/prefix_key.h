#pragma once
// Prefix keys (DESIGN §4 "Keys"): the name of every global-KV block a prompt produces.
//
// A prompt is cut into blocks of block_tokens() tokens, and block i is named by a chained hash
//     key_i = XXH3-128(key_{i-1} || tokens of block i),    key_{-1} = salt
// so a key names the whole prefix up to the end of its block, not just the block's tokens: two
// prompts share key_i exactly when they share their first (i+1) blocks. Every position of an image
// span carries the same token id, so a block that an image's span overlaps also hashes, after its
// tokens, that image's span and content hash (ImageSpanKey): two prompts with the same ids and
// different images never share the blocks from the first image on. The salt is the XXH3-128
// of a fingerprint text covering everything else the KV depends on (the model's config, its
// weight quantization, the KV formats, and what the caller adds: the checkpoint's identity, image
// hashes), so that KV computed under another model or format is never found.
//
// A block must end where every compressed stream ends a group, so that a cached block holds only
// whole compressed entries and whole candidate blocks; hence block_tokens() is a multiple of
// block_unit(). See docs/kv-tiers.md.
#include <span>
#include <string>
#include <vector>

#include "kv/block_key.h"
#include "model/config.h"

namespace dsv41 {

// The least common multiple of every compression ratio in use and of the tokens one candidate
// block spans (candidate_block_size entries of the candidate source, i.e. times its ratio).
int block_unit(const Config& config);

// The default block size: the smallest multiple of block_unit() that is at least this many
// tokens, so that a block's key and tokens stay small next to its KV.
inline constexpr int kMinBlockTokens = 64;
int block_tokens(const Config& config);

// Refuses a user-given block size that is not a positive multiple of block_unit(config).
void validate_block_tokens(const Config& config, int tokens);

// An image in a prompt as the keys see it: its span [start, start + length) and the hash of its
// content (engine/prompt_image.h: of the decoded pixels). A prompt's images are listed by start.
struct ImageSpanKey {
  int64_t start = 0, length = 0;
  BlockKey content;
  friend bool operator==(const ImageSpanKey&, const ImageSpanKey&) = default;
};

class PrefixKeys {
 public:
  // `extra_salt` is mixed into the fingerprint: the checkpoint's identity (two checkpoints of
  // one config have different weights) and the hashes of any images in the prompt. `tokens_per_block`
  // 0 picks block_tokens(config); any other value is validated.
  explicit PrefixKeys(const Config& config, const std::string& extra_salt = "", int tokens_per_block = 0);

  int block_tokens() const { return block_tokens_; }
  // The text the salt hashes, readable so that a mismatch between two processes can be diagnosed.
  const std::string& fingerprint() const { return fingerprint_; }
  const BlockKey& salt() const { return salt_; }

  // The key after `previous` (salt() for the first block) of one block of tokens, the prompt's
  // positions [at, at + block.size()), with every image of `images` whose span overlaps them.
  BlockKey next(const BlockKey& previous, std::span<const int> block, int64_t at = 0,
                std::span<const ImageSpanKey> images = {}) const;
  // One key per complete block of `tokens`; a trailing partial block has none.
  std::vector<BlockKey> keys(std::span<const int> tokens, std::span<const ImageSpanKey> images = {}) const;
  // The key of the whole of `tokens`, partial tail included: the last block key when the length is
  // a multiple of the block size, else next(last block key, tail). The SWA pool is keyed by it
  // (with the length), since its entries sit at the end of a prompt or an output, not at a block end.
  BlockKey prefix_key(std::span<const int> tokens, std::span<const ImageSpanKey> images = {}) const;

 private:
  std::string fingerprint_;
  BlockKey salt_;
  int block_tokens_ = 0;
};

}  // namespace dsv41
