#include "kv/prefix_key.h"

#include <xxhash.h>

#include <cstdint>
#include <numeric>

#include "base/error.h"
#include "numerics/codecs.h"

namespace dsv41 {
namespace {

// Bumped whenever the meaning of a stored block changes in a way the config does not show (a codec
// fix, a new layout of the payload), so that old blocks stop matching.
constexpr const char* kKeyScheme = "dsv41 prefix keys v1";

// Announces an image's record in a block's hash input (PrefixKeys::next).
constexpr uint32_t kImageMarker = 0xFFFFFFFFu;

BlockKey from_hash(XXH128_hash_t h) { return BlockKey{h.high64, h.low64}; }

// Little-endian byte images, so that keys are the same on every host (they name files on disk).
void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

// Only the fields that change the KV: the runtime limits size caches and sampling, never the values
// in them, so changing them must not invalidate a persistent store.
std::string kv_relevant_config_json(const Config& config) {
  Config c = config;
  const Config defaults;
  c.source.clear();
  c.max_batch_size = defaults.max_batch_size;
  c.max_seq_len = defaults.max_seq_len;
  c.temperature = defaults.temperature;
  return to_official_json(c);
}

}  // namespace

int block_unit(const Config& config) {
  int unit = 1;
  for (int layer = 0; layer < config.n_total_layers(); ++layer)
    if (config.compress_ratios.at(layer) > 0) unit = std::lcm(unit, config.compress_ratios.at(layer));
  if (config.candidate_source_layer >= 0)
    unit = std::lcm(unit, config.candidate_block_size * config.compress_ratios.at(config.candidate_source_layer));
  return unit;
}

int block_tokens(const Config& config) {
  const int unit = block_unit(config);
  return (kMinBlockTokens + unit - 1) / unit * unit;
}

void validate_block_tokens(const Config& config, int tokens) {
  const int unit = block_unit(config);
  if (tokens <= 0 || tokens % unit != 0)
    fail("prefix cache block size",
         "a positive multiple of " + std::to_string(unit) +
             " tokens (the least common multiple of the compression ratios and of the tokens of one candidate block)",
         std::to_string(tokens));
}

PrefixKeys::PrefixKeys(const Config& config, const std::string& extra_salt, int tokens_per_block) {
  block_tokens_ = tokens_per_block == 0 ? dsv41::block_tokens(config) : tokens_per_block;
  validate_block_tokens(config, block_tokens_);
  // Each KV format by name and by its bytes per entry at this model's dimensions.
  fingerprint_ = std::string(kKeyScheme) + "\n" +
                 "config " + kv_relevant_config_json(config) + "\n" +
                 "quantization dtype=" + config.dtype + " expert_dtype=" + config.expert_dtype.value_or("none") + "\n" +
                 "kv main=kv-fp4/" + std::to_string(kv_fp4::bytes(config.head_dim)) +
                 " index=mxfp4/" + std::to_string(mxfp4::bytes(config.index_head_dim)) +
                 " swa=swa-fp8/" + std::to_string(swa_fp8::bytes(config.head_dim)) + "\n" +
                 "block_tokens " + std::to_string(block_tokens_) + "\n" +
                 "extra " + extra_salt + "\n";
  salt_ = from_hash(XXH3_128bits(fingerprint_.data(), fingerprint_.size()));
}

BlockKey PrefixKeys::next(const BlockKey& previous, std::span<const int> block, int64_t at,
                           std::span<const ImageSpanKey> images) const {
  std::vector<uint8_t> bytes;
  bytes.reserve(16 + 4 * block.size());
  put_u64(bytes, previous.hi);
  put_u64(bytes, previous.lo);
  for (int token : block) put_u32(bytes, uint32_t(token));
  // Each image overlapping the block: a marker no token id spells (ids are below 2^31), then its
  // span and content hash, so that a text block's bytes are what they were before images existed.
  const int64_t end = at + int64_t(block.size());
  for (const ImageSpanKey& image : images) {
    if (image.start >= end || image.start + image.length <= at) continue;
    put_u32(bytes, kImageMarker);
    put_u64(bytes, uint64_t(image.start));
    put_u64(bytes, uint64_t(image.length));
    put_u64(bytes, image.content.hi);
    put_u64(bytes, image.content.lo);
  }
  return from_hash(XXH3_128bits(bytes.data(), bytes.size()));
}

std::vector<BlockKey> PrefixKeys::keys(std::span<const int> tokens, std::span<const ImageSpanKey> images) const {
  std::vector<BlockKey> out;
  BlockKey key = salt_;
  for (size_t start = 0; start + block_tokens_ <= tokens.size(); start += block_tokens_) {
    key = next(key, tokens.subspan(start, block_tokens_), int64_t(start), images);
    out.push_back(key);
  }
  return out;
}

BlockKey PrefixKeys::prefix_key(std::span<const int> tokens, std::span<const ImageSpanKey> images) const {
  const std::vector<BlockKey> blocks = keys(tokens, images);
  const size_t covered = blocks.size() * size_t(block_tokens_);
  const BlockKey last = blocks.empty() ? salt_ : blocks.back();
  // A tail is shorter than a block, so its hash input never equals a whole block's (with images:
  // its first image marker stands where a block has a token).
  return covered == tokens.size() ? last : next(last, tokens.subspan(covered), int64_t(covered), images);
}

}  // namespace dsv41
