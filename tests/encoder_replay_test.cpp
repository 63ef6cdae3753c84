// Encoder bounded replay (DESIGN §3, report §3.2.2): on a global-KV hit at H with an SWA miss,
// the encoder replays [H - W, H) together with the uncached suffix, its windows truncated at
// s = H - W, to regenerate the SWA rings; the replayed rows read the cached global KV and never
// rewrite it. In exact mode every layer replays, far enough back that the rings come out exact.
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

namespace {

// Fixture v41-tiny, its prompt2 (300 tokens) with the Engram hashes, and a global hit at H (every
// complete block) restored from a cold run's blocks.
struct EncoderReplay : ::testing::Test {
  std::unique_ptr<Model> model = Model::load(fixture_dir("v41-tiny"));
  const Config& c = model->config();
  std::vector<int> tokens;
  std::vector<int64_t> h;
  int64_t P = 0, B = block_tokens(c), H = 0;
  int64_t per_token = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();

  EncoderReplay() {
    Expected ex("v41-tiny");
    const std::vector<int64_t> t = ex.ints("prompt2.tokens");
    tokens.assign(t.begin(), t.end());
    h = ex.ints("prompt2.prefill.engram_hash");
    P = int64_t(tokens.size());
    H = P / B * B;
  }
  // The hit's state for a replay from s: the global KV of [0, H), no SWA.
  SequenceState hit(const SequenceState& cold, int64_t s) const {
    std::vector<std::vector<uint8_t>> blocks;
    for (int64_t b = 0; b < H / B; ++b) blocks.push_back(global_block(c, cold, b, int(B)));
    SequenceState warm = restore_sequence(c, test::payloads(blocks), int(B));
    warm.length = s;
    return warm;
  }
  std::vector<float> replay(SequenceState& warm, const ForwardOptions& options) const {
    const int64_t s = warm.length;
    return forward(*model, warm, std::span<const int>(tokens).subspan(size_t(s)), h.data() + s * per_token, options);
  }
};

}  // namespace

TEST_F(EncoderReplay, RegeneratesSwaFromCachedGlobalKv) {
  const int64_t W = c.window_size, s = H - W;  // replay from H - W
  ASSERT_GT(H, W);

  // The cold run, in default mode.
  SequenceState cold(c);
  ForwardOptions cold_options;
  cold_options.decoder_from = P - W;
  const std::vector<float> cold_logits = forward(*model, cold, tokens, h.data(), cold_options);

  SequenceState warm = hit(cold, s);
  ForwardOptions options;
  options.replay_until = H;
  options.decoder_from = P - W;
  const std::vector<float> warm_logits = replay(warm, options);
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

// Exact mode's replay: every layer reruns [H - R, H), R = exact_replay_rows, its windows truncated
// at the start. Every ring at H, the logits and the state's KV then equal the cold run's bit for
// bit (each row's arithmetic depends on its inputs alone: chunked prefill equals one-shot).
TEST_F(EncoderReplay, ExactReplayRegeneratesEveryRingBitForBit) {
  const int64_t R = exact_replay_rows(c), s = H - R;
  ASSERT_EQ(R, c.window_size + (c.n_layers - 1) * (c.window_size - 1));
  ASSERT_GT(s, 0);

  SequenceState cold(c);
  const std::vector<float> cold_logits = forward(*model, cold, tokens, h.data());

  SequenceState warm = hit(cold, s);
  ForwardOptions options;
  options.replay_until = H;
  options.exact_replay = true;
  const std::vector<float> warm_logits = replay(warm, options);

  EXPECT_EQ(warm.length, P);
  EXPECT_EQ(warm_logits, cold_logits);
  for (size_t l = 0; l < cold.window.size(); ++l) EXPECT_EQ(warm.window[l], cold.window[l]) << "layer " << l << "'s ring";
  for (int l : c.kv_source_layers) {
    const CompressedCache& a = warm.compressed.at(l);
    const CompressedCache& b = cold.compressed.at(l);
    EXPECT_EQ(a.entries, b.entries) << l;
    EXPECT_EQ(a.kv, b.kv) << l;
    EXPECT_EQ(a.index_k, b.index_k) << l;
    EXPECT_EQ(a.pending, b.pending) << l;
    EXPECT_EQ(a.pending_kv, b.pending_kv) << l;
  }
}

// An exact replay belongs to exact mode: with a decoder cut, or without a replay point, it is refused.
TEST_F(EncoderReplay, RefusesAnExactReplayOutsideExactMode) {
  const std::vector<int> few(40, 5);
  std::vector<int64_t> ids(few.size() * c.engram_layer_ids.size() * size_t(c.engram_hash_columns()), 0);
  ForwardOptions bare;
  bare.exact_replay = true;
  SequenceState fresh(c);
  EXPECT_THROW(forward(*model, fresh, few, ids.data(), bare), Error);
  EXPECT_EQ(fresh.length, 0);
  ForwardOptions cut;
  cut.exact_replay = true;
  cut.decoder_from = 30;
  cut.replay_until = 20;
  SequenceState state(c);
  state.length = 10;
  EXPECT_THROW(forward(*model, state, std::span<const int>(few).first(30), ids.data(), cut), Error);
  EXPECT_EQ(state.length, 10);
}

TEST_F(EncoderReplay, RefusesAReplayPointOutsideTheCall) {
  SequenceState state(c);
  const std::vector<int> few = {0, 5, 6};
  std::vector<int64_t> ids(3 * 12, 0);
  ForwardOptions bad;
  bad.replay_until = 10;
  EXPECT_THROW(forward(*model, state, few, ids.data(), bad), Error);
}
