// Encoder bounded replay (DESIGN §3, report §3.2.2): on a global-KV hit at H with an SWA miss,
// the encoder replays [H - W, H) together with the uncached suffix, its windows truncated at
// s = H - W, to regenerate the SWA rings; the replayed rows read the cached global KV and never
// rewrite it.
#include <gtest/gtest.h>

#include <cstdio>

#include "base/error.h"
#include "fixture.h"
#include "forward/forward.h"
#include "kv/prefix_key.h"
#include "kv/sequence_blocks.h"
#include "test_util.h"

using namespace dsv41;
using namespace dsv41::test;

TEST(EncoderReplay, RegeneratesSwaFromCachedGlobalKv) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  const Config& c = model->config();
  Expected ex("v41-tiny");
  std::vector<int64_t> t = ex.ints("prompt2.tokens"), h = ex.ints("prompt2.prefill.engram_hash");
  const std::vector<int> tokens(t.begin(), t.end());
  const int64_t P = int64_t(tokens.size()), W = c.window_size, B = block_tokens(c);
  const int64_t per_token = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
  const int64_t H = (P / B) * B, s = H - W;  // the hit: every complete block; replay from H - W
  ASSERT_GT(H, W);

  // The cold run, in default mode.
  SequenceState cold(c);
  ForwardOptions cold_options;
  cold_options.decoder_from = P - W;
  const std::vector<float> cold_logits = forward(*model, cold, tokens, h.data(), cold_options);

  // The hit: the global KV of [0, H) from the cold run's blocks, no SWA.
  std::vector<std::vector<uint8_t>> blocks;
  for (int64_t b = 0; b < H / B; ++b) blocks.push_back(global_block(c, cold, b, int(B)));
  SequenceState warm = restore_sequence(c, test::payloads(blocks), int(B));
  warm.length = s;
  ForwardOptions replay;
  replay.replay_until = H;
  replay.decoder_from = P - W;
  const std::vector<float> warm_logits =
      forward(*model, warm, std::span<const int>(tokens).subspan(size_t(s)), h.data() + s * per_token, replay);
  EXPECT_EQ(warm.length, P);

  // The cached global KV of [0, H) is read, never rewritten: byte for byte the cold run's.
  for (int l : c.kv_source_layers) {
    const int64_t cached = H / c.compress_ratios[size_t(l)];
    const CompressedCache& a = warm.compressed.at(l);
    const CompressedCache& b = cold.compressed.at(l);
    EXPECT_EQ(a.entries, b.entries);
    EXPECT_TRUE(std::equal(a.kv.begin(), a.kv.begin() + cached * (a.kv.size() / a.entries), b.kv.begin())) << l;
    EXPECT_TRUE(std::equal(a.index_k.begin(), a.index_k.begin() + cached * (a.index_k.size() / a.entries), b.index_k.begin()))
        << l;
  }
  // Layer 0's window KV of a position depends on that position alone, so the regenerated ring is
  // the cold one, byte for byte. Truncation at s moves deeper layers' rings by at most W positions
  // per layer: those differ, and so, slightly, do the logits.
  EXPECT_EQ(warm.window[0], cold.window[0]);
  LogitStats d = compare_logits(warm_logits, cold_logits, c.vocab_size);
  std::printf("replay from %ld (hit at %ld of %ld tokens) vs cold: max |dlogit| %.4f\n", long(s), long(H), long(P), d.max);
  EXPECT_TRUE(std::isfinite(d.max));
  EXPECT_EQ(warm.encoder_window_floor, s);
}

TEST(EncoderReplay, RefusesAReplayPointOutsideTheCall) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  SequenceState state(model->config());
  std::vector<int> tokens = {0, 5, 6};
  std::vector<int64_t> ids(3 * 12, 0);
  ForwardOptions bad;
  bad.replay_until = 10;
  EXPECT_THROW(forward(*model, state, tokens, ids.data(), bad), Error);
}
