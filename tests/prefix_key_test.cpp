// Prefix keys: the block size rule, the chaining (a key names its whole prefix), and the salt
// (another model, format or caller salt never shares a key).
#include <gtest/gtest.h>
#include <xxhash.h>

#include <numeric>
#include <vector>

#include "base/error.h"
#include "kv/prefix_key.h"
#include "model/config.h"

using namespace dsv41;

namespace {

std::vector<int> ramp(int n, int start = 0) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

}  // namespace

TEST(PrefixKeys, BlockSizeIsAMultipleOfEveryRatioAndOfTheCandidateBlock) {
  // tiny: ratios 2 and 1, candidate blocks of 4 entries of a ratio-1 source.
  EXPECT_EQ(block_unit(preset("tiny")), 4);
  // V4.1-Flash: ratios 2 and 1, candidate blocks of 8 entries of layer 20 (ratio 1).
  EXPECT_EQ(block_unit(preset("deepseek-v4.1-flash")), 8);
  EXPECT_EQ(block_tokens(preset("tiny")), 64);
  EXPECT_EQ(block_tokens(preset("deepseek-v4.1-flash")), 64);

  // A candidate block counts entries of its source: 3 entries at ratio 2 span 6 tokens.
  Config c = preset("tiny");
  c.candidate_source_layer = 2;
  c.candidate_block_size = 3;
  EXPECT_EQ(block_unit(c), 6);
  EXPECT_EQ(block_tokens(c), 66);  // the smallest multiple of 6 from 64 up

  // Without a candidate source only the ratios count.
  c.candidate_source_layer = -1;
  c.compress_ratios[2] = c.compress_ratios[3] = 5;
  EXPECT_EQ(block_unit(c), 5);
  EXPECT_EQ(block_tokens(c), 65);
}

TEST(PrefixKeys, UserBlockSizeIsValidated) {
  const Config tiny = preset("tiny");
  EXPECT_NO_THROW(validate_block_tokens(tiny, 4));
  EXPECT_EQ(PrefixKeys(tiny, "", 128).block_tokens(), 128);
  EXPECT_THROW(PrefixKeys(tiny, "", 6), Error);  // the constructor validates too (0 picks the default)
  for (int bad : {0, -4, 6, 66}) {
    try {
      validate_block_tokens(tiny, bad);
      ADD_FAILURE() << "accepted block size " << bad;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("prefix cache block size"), std::string::npos) << msg;
      EXPECT_NE(msg.find("a positive multiple of 4 tokens"), std::string::npos) << msg;
      EXPECT_NE(msg.find("found " + std::to_string(bad)), std::string::npos) << msg;
    }
  }
}

TEST(PrefixKeys, OneKeyPerCompleteBlock) {
  const PrefixKeys keys(preset("tiny"));
  EXPECT_TRUE(keys.keys(ramp(63)).empty());
  EXPECT_EQ(keys.keys(ramp(64)).size(), 1u);
  EXPECT_EQ(keys.keys(ramp(64 * 3 + 10)).size(), 3u);
}

TEST(PrefixKeys, SamePrefixSameKeys) {
  const PrefixKeys a(preset("tiny")), b(preset("tiny"));
  const std::vector<int> tokens = ramp(64 * 4, 7);
  EXPECT_EQ(a.keys(tokens), b.keys(tokens));
  // A longer prompt with the same start shares every key of the start.
  std::vector<int> longer = tokens;
  longer.insert(longer.end(), 100, 3);
  const std::vector<BlockKey> long_keys = a.keys(longer);
  ASSERT_EQ(long_keys.size(), 5u);
  EXPECT_EQ(std::vector<BlockKey>(long_keys.begin(), long_keys.begin() + 4), a.keys(tokens));
}

TEST(PrefixKeys, ChangingOneTokenChangesThatBlockAndEveryLaterOne) {
  const PrefixKeys keys(preset("tiny"));
  const std::vector<int> tokens = ramp(64 * 5);
  const std::vector<BlockKey> base = keys.keys(tokens);
  for (int changed_block = 0; changed_block < 5; ++changed_block) {
    std::vector<int> edited = tokens;
    edited[changed_block * 64 + 17] += 1;
    const std::vector<BlockKey> got = keys.keys(edited);
    ASSERT_EQ(got.size(), base.size());
    for (int i = 0; i < 5; ++i) {
      if (i < changed_block) EXPECT_EQ(got[i], base[i]) << "block " << i << " edit in " << changed_block;
      else EXPECT_NE(got[i], base[i]) << "block " << i << " edit in " << changed_block;
    }
  }
  // Equal blocks at different depths get different keys: the key names the prefix, not the block.
  const std::vector<BlockKey> repeated = keys.keys(std::vector<int>(64 * 3, 5));
  EXPECT_NE(repeated[0], repeated[1]);
  EXPECT_NE(repeated[1], repeated[2]);
}

TEST(PrefixKeys, EveryKvRelevantChangeChangesEveryKey) {
  const Config tiny = preset("tiny");
  const std::vector<int> tokens = ramp(64 * 3);
  const std::vector<BlockKey> base = PrefixKeys(tiny).keys(tokens);

  std::vector<std::pair<std::string, Config>> variants;
  Config c = tiny;
  c.head_dim = 128;  // another KV entry size
  variants.emplace_back("head_dim", c);
  c = tiny;
  c.index_head_dim = 64;  // another index key size
  variants.emplace_back("index_head_dim", c);
  c = tiny;
  c.compress_ratios[2] = c.compress_ratios[3] = 4;  // another ratio (same block size)
  variants.emplace_back("compress_ratios", c);
  c = tiny;
  c.dtype = "bf16";  // another weight quantization
  c.expert_dtype = "bf16";
  variants.emplace_back("dtype", c);
  c = tiny;
  c.window_size = 32;
  variants.emplace_back("window_size", c);

  for (const auto& [name, config] : variants) {
    const PrefixKeys keys(config);
    EXPECT_NE(keys.fingerprint(), PrefixKeys(tiny).fingerprint()) << name;
    const std::vector<BlockKey> got = keys.keys(tokens);
    ASSERT_EQ(got.size(), base.size()) << name;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NE(got[i], base[i]) << name << " block " << i;
  }

  // The caller's salt (checkpoint identity, image hashes) separates keys the same way.
  const std::vector<BlockKey> salted = PrefixKeys(tiny, "image:0123abcd").keys(tokens);
  for (size_t i = 0; i < salted.size(); ++i) EXPECT_NE(salted[i], base[i]) << "block " << i;
}

TEST(PrefixKeys, RuntimeLimitsDoNotChangeKeys) {
  Config c = preset("tiny");
  const PrefixKeys base(c);
  c.max_seq_len *= 2;
  c.max_batch_size += 3;
  c.temperature = 0.5;
  c.source = "elsewhere/config.json";
  EXPECT_EQ(PrefixKeys(c).fingerprint(), base.fingerprint());
  EXPECT_EQ(PrefixKeys(c).salt(), base.salt());
}

TEST(PrefixKeys, FingerprintNamesTheKvFormats) {
  const std::string fp = PrefixKeys(preset("deepseek-v4.1-flash")).fingerprint();
  EXPECT_NE(fp.find("main=kv-fp4/288"), std::string::npos) << fp;
  EXPECT_NE(fp.find("index=mxfp4/68"), std::string::npos) << fp;
  EXPECT_NE(fp.find("swa=swa-fp8/528"), std::string::npos) << fp;
  EXPECT_NE(fp.find("\"compress_ratios\""), std::string::npos) << fp;
}

// The byte layout docs/kv-tiers.md documents: previous key hi, lo (little-endian u64), then each
// token as a little-endian u32, hashed by XXH3-128; the salt is XXH3-128 of the fingerprint text.
TEST(PrefixKeys, KeyIsXxh3OfThePreviousKeyAndTheTokens) {
  const PrefixKeys keys(preset("tiny"));
  const XXH128_hash_t salt = XXH3_128bits(keys.fingerprint().data(), keys.fingerprint().size());
  EXPECT_EQ(keys.salt(), (BlockKey{salt.high64, salt.low64}));

  const std::vector<int> block = ramp(64, 1000);
  std::vector<uint8_t> bytes;
  for (uint64_t word : {keys.salt().hi, keys.salt().lo})
    for (int i = 0; i < 8; ++i) bytes.push_back(uint8_t(word >> (8 * i)));
  for (int t : block)
    for (int i = 0; i < 4; ++i) bytes.push_back(uint8_t(uint32_t(t) >> (8 * i)));
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  EXPECT_EQ(keys.keys(block).at(0), (BlockKey{h.high64, h.low64}));
}

TEST(PrefixKeys, PrefixKeyCoversThePartialTail) {
  const PrefixKeys keys(preset("tiny"));
  const std::vector<int> tokens = ramp(64 * 2 + 5);
  const std::span<const int> all(tokens);
  // Aligned: the last block's key.
  EXPECT_EQ(keys.prefix_key(all.first(128)), keys.keys(all.first(128)).back());
  // The tail counts: another tail token or another tail length is another key.
  std::vector<int> other = tokens;
  other.back() += 1;
  EXPECT_NE(keys.prefix_key(all), keys.prefix_key(other));
  EXPECT_NE(keys.prefix_key(all), keys.prefix_key(all.first(tokens.size() - 1)));
  EXPECT_NE(keys.prefix_key(all), keys.keys(all).back());
  EXPECT_EQ(keys.prefix_key({}), keys.salt());
}

// Images (ImageSpanKey): every position of a span carries the same id, so the key of a block the
// span overlaps holds the image's span and content. Blocks before the first image keep the keys
// of the text; the same image keys the same; another image, or the same at another place, does
// not, from its first block on; a text-only prompt's keys are what they were before images.
TEST(PrefixKeys, ImageSpansKeyTheirBlocks) {
  const PrefixKeys keys(preset("tiny"), "", 64);
  std::vector<int> tokens = ramp(64 * 4);
  for (int p = 100; p < 150; ++p) tokens[size_t(p)] = 1020;  // the span [100, 150): blocks 1 and 2
  const ImageSpanKey a{100, 50, BlockKey{1, 2}}, b{100, 50, BlockKey{1, 3}};
  const std::vector<BlockKey> text = keys.keys(tokens), with_a = keys.keys(tokens, std::vector{a});
  EXPECT_EQ(with_a[0], text[0]);
  for (size_t i = 1; i < 4; ++i) EXPECT_NE(with_a[i], text[i]) << i;  // block 3 follows the chain
  EXPECT_EQ(keys.keys(tokens, std::vector{a}), with_a);
  const std::vector<BlockKey> with_b = keys.keys(tokens, std::vector{b});
  EXPECT_EQ(with_b[0], with_a[0]);
  for (size_t i = 1; i < 4; ++i) EXPECT_NE(with_b[i], with_a[i]) << i;
  const std::vector<BlockKey> moved = keys.keys(tokens, std::vector{ImageSpanKey{101, 49, BlockKey{1, 2}}});
  EXPECT_NE(moved[1], with_a[1]);
  // An image that overlaps no block of the prompt (after its end) changes nothing.
  EXPECT_EQ(keys.keys(tokens, std::vector{ImageSpanKey{300, 10, BlockKey{1, 2}}}), text);
  // The key of a whole prompt (the SWA pool's) too, through a partial tail holding the span.
  const std::span<const int> prefix = std::span<const int>(tokens).first(120);
  EXPECT_NE(keys.prefix_key(prefix, std::vector{a}), keys.prefix_key(prefix));
  EXPECT_NE(keys.prefix_key(prefix, std::vector{a}), keys.prefix_key(prefix, std::vector{b}));
  EXPECT_EQ(keys.prefix_key(prefix, std::vector{a}), keys.prefix_key(prefix, std::vector{a}));
  // Text blocks hash as the bytes they always did: previous key, then the ids.
  std::vector<uint8_t> bytes;
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) bytes.push_back(uint8_t(v >> (8 * i)));
  };
  put(keys.salt().hi, 8);
  put(keys.salt().lo, 8);
  for (int t = 0; t < 64; ++t) put(uint32_t(t), 4);
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  EXPECT_EQ(text[0], (BlockKey{h.high64, h.low64}));
}
