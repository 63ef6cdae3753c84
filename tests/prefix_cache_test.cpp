// The engine over the KV tiers (DESIGN §3–4, §6): a prompt is served from the running sequence,
// an SWA-pool tail (exactly), or global blocks with a replay (default mode: the encoder's, hits
// past the window only; exact mode: every layer's, exactly), and stores what it makes. Tested on fixture v41-tiny (W = 16).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "engine/session.h"
#include "fixture.h"
#include "forward/window.h"
#include "kv/block_key.h"
#include "kv/sequence_blocks.h"
#include "model/engram_compress.h"
#include "test_util.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

int argmax(const std::vector<float>& logits) {
  return int(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

struct PrefixCacheTest : ::testing::Test {
  std::unique_ptr<Model> model = Model::load(fixture_dir("v41-tiny"));
  const Config& c = model->config();
  Tokenizer tokenizer = Tokenizer::from_file(fixture_dir("v41-tiny") + "/tokenizer.json");
  ManualClock clock{1'000'000};
  std::vector<int> text;  // fixture prompt2: 300 tokens

  PrefixCacheTest() {
    std::vector<int64_t> t = Expected("v41-tiny").ints("prompt2.tokens");
    text.assign(t.begin(), t.end());
  }

  KvCacheOptions options(Mode mode, int block_tokens = 0) {
    KvCacheOptions o;
    o.fingerprint = "v41-tiny fixture";
    o.mode = mode_name(mode);
    o.block_tokens = block_tokens;
    o.host_budget_bytes = 64 << 20;
    o.swa = SwaPoolOptions{64 << 20, 60'000, &clock};
    o.clock = &clock;
    return o;
  }
  std::vector<int> first(size_t n) const { return std::vector<int>(text.begin(), text.begin() + n); }

  // Turn one: the first 150 tokens of the text as a prompt, then 10 greedy tokens, then save.
  // Returns the conversation so far.
  std::vector<int> turn_one(Session& s, KvCache& cache) {
    std::vector<int> conversation = first(150);
    std::vector<float> logits = s.prefill_prompt(conversation, &cache);
    for (int k = 0; k < 10; ++k) {
      conversation.push_back(argmax(logits));
      logits = s.decode(conversation.back());
    }
    s.save(cache);
    return conversation;
  }
  // Turn two's prompt: the conversation, then the text's tokens 160..299 as the next input.
  std::vector<int> turn_two(std::vector<int> conversation) const {
    conversation.insert(conversation.end(), text.begin() + 160, text.end());
    return conversation;
  }
};

}  // namespace

// "A cache hit with SWA present equals the cold run": a new session that finds the end-of-output
// tail goes on bit for bit as the session that never stopped.
TEST_F(PrefixCacheTest, SwaHitContinuesExactly) {
  for (Mode mode : {Mode::Default, Mode::Exact}) {
    KvCache cache(c, options(mode));
    Session a(*model, &tokenizer, mode);
    const std::vector<int> conversation = turn_one(a, cache);
    const std::vector<int> prompt = turn_two(conversation);

    Session b(*model, &tokenizer, mode);
    PrefixUse use;
    const std::vector<float> restored = b.prefill_prompt(prompt, &cache, &use);
    EXPECT_EQ(use.swa_tokens, 160);
    EXPECT_EQ(use.computed(), 140);
    EXPECT_EQ(use.replayed, 0);
    EXPECT_EQ(use.host_blocks, 2);  // 160 tokens: two complete blocks of 64 under the tail

    const std::vector<float> live = a.prefill(std::span(prompt).subspan(160));
    EXPECT_EQ(restored, live) << mode_name(mode);
    EXPECT_EQ(b.state().kv_bytes(), a.state().kv_bytes());
  }
}

// The running sequence is the device tier: a prompt that extends it runs only its new tokens.
TEST_F(PrefixCacheTest, RunningSequenceIsContinued) {
  KvCache cache(c, options(Mode::Default));
  Session a(*model, &tokenizer);
  const std::vector<int> prompt = turn_two(turn_one(a, cache));
  PrefixUse use;
  a.prefill_prompt(prompt, &cache, &use);
  EXPECT_EQ(use.device_tokens, 160);
  EXPECT_EQ(use.computed(), 140);
  EXPECT_EQ(cache.stats().counters.device_tokens, 160);

  // A prompt that does not extend it (an edited history) starts over from the tiers.
  std::vector<int> edited = prompt;
  edited[155] = (edited[155] + 1) % c.vocab_size;
  a.prefill_prompt(edited, &cache, &use);
  EXPECT_EQ(use.device_tokens, 0);
  EXPECT_EQ(use.swa_tokens, 150);  // the end-of-prompt tail of turn one, before the edit
}

// On a global hit with the SWA tail expired, default mode replays the encoder over [H - W, H):
// the same computation as the forward's replay path given those blocks, leaving the cached global
// KV as it was.
TEST_F(PrefixCacheTest, GlobalHitWithSwaMissReplaysTheEncoder) {
  KvCache cache(c, options(Mode::Default));
  Session a(*model, &tokenizer);
  const std::vector<int> prompt = turn_two(turn_one(a, cache));
  clock.advance_ms(60'000);  // the TTL: both tails of turn one expire

  Session b(*model, &tokenizer);
  PrefixUse use;
  const std::vector<float> replayed = b.prefill_prompt(prompt, &cache, &use);
  const int64_t H = 128, W = c.window_size, P = int64_t(prompt.size());
  EXPECT_EQ(use.global_tokens, H);
  EXPECT_EQ(use.swa_tokens, 0);
  EXPECT_EQ(use.replayed, W);
  EXPECT_EQ(use.computed(), P - H);
  EXPECT_EQ(b.work().encoder_tokens, P - H + W);
  EXPECT_GE(cache.stats().swa.ttl_expiries, 2);
  EXPECT_EQ(cache.stats().counters.replayed_tokens, W);

  // By hand: the blocks from the session that computed them, replay from H - W.
  std::vector<std::vector<uint8_t>> blocks;
  for (int64_t blk = 0; blk < H / 64; ++blk) blocks.push_back(global_block(c, a.state(), blk, 64));
  SequenceState state = restore_sequence(c, test::payloads(blocks), 64);
  state.length = H - W;
  const std::vector<int> suffix(prompt.begin() + (H - W), prompt.end());
  EngramHasher hasher(c, engram_compress_vocabulary(tokenizer).token_map);
  EngramHistory history = hasher.history_after(std::span(prompt).first(size_t(H - W)), {});
  std::vector<int64_t> ids(suffix.size() * size_t(hasher.n_layers() * hasher.columns()));
  hasher.hash(suffix, {}, history, ids.data());
  ForwardOptions o;
  o.replay_until = H;
  o.decoder_from = P - W;
  EXPECT_EQ(replayed, forward(*model, state, suffix, ids.data(), o));
  for (int l : c.kv_source_layers) {
    const size_t cached = size_t(H / c.compress_ratios[size_t(l)]) * (state.compressed.at(l).kv.size() / state.compressed.at(l).entries);
    EXPECT_TRUE(std::equal(state.compressed.at(l).kv.begin(), state.compressed.at(l).kv.begin() + cached,
                           a.state().compressed.at(l).kv.begin()));
  }

  // The approximation is small next to the cold default run (report §3.2.2).
  Session cold(*model, &tokenizer);
  LogitStats d = compare_logits(replayed, cold.prefill(prompt), c.vocab_size);
  std::printf("replay at H=%ld vs cold default run: max |dlogit| %.4f\n", long(H), d.max);
  EXPECT_TRUE(std::isfinite(d.max));
}

// DESIGN §3: hits no longer than the window are not adopted (H <= W: the cold run, to the bit).
// With blocks of 8 tokens a two-block hit is H = 16 = W; three blocks (24) are adopted.
TEST_F(PrefixCacheTest, HitsNoLongerThanTheWindowAreNotAdopted) {
  const int64_t W = c.window_size;
  ASSERT_EQ(W, 16);
  KvCache cache(c, options(Mode::Default, 8));
  Session seed(*model, &tokenizer);
  seed.prefill_prompt(first(20), &cache);  // stores blocks [0, 8) and [8, 16), tail at 20
  clock.advance_ms(60'000);

  Session a(*model, &tokenizer);
  PrefixUse use;
  const std::vector<float> got = a.prefill_prompt(first(60), &cache, &use);
  EXPECT_EQ(use.cached(), 0);
  EXPECT_EQ(use.short_hit, 16);
  EXPECT_EQ(use.host_blocks, 0);
  Session cold(*model, &tokenizer);
  EXPECT_EQ(got, cold.prefill(first(60)));

  clock.advance_ms(60'000);
  Session b(*model, &tokenizer);
  b.prefill_prompt(first(70), &cache, &use);  // a's run stored 7 blocks: H = 56 > W
  EXPECT_EQ(use.global_tokens, 56);
  EXPECT_EQ(use.replayed, W);
  EXPECT_EQ(cache.stats().counters.short_hits, 1);
}

// Exact mode adopts global blocks without their SWA tail through its exact replay: every layer
// reruns the last exact_replay_rows positions of the hit, and the sequence goes on bit for bit as a
// cold run. A restart (the SWA pool gone, the store kept) is served so; a hit no longer than the
// replay is not adopted.
TEST_F(PrefixCacheTest, ExactModeReplaysEveryLayerAfterARestart) {
  TempDir dir("prefix_cache");
  KvCacheOptions o = options(Mode::Exact);
  o.store_dir = dir.string();
  {
    KvCache cache(c, o);
    Session a(*model, &tokenizer, Mode::Exact);
    a.prefill_prompt(first(270), &cache);
    cache.flush();
    EXPECT_EQ(cache.stats().store->blocks, 4u);
  }
  KvCache cache(c, o);
  Session b(*model, &tokenizer, Mode::Exact), cold(*model, &tokenizer, Mode::Exact);
  PrefixUse use;
  std::vector<float> got = b.prefill_prompt(text, &cache, &use), want = cold.prefill(text);
  EXPECT_EQ(use.disk_blocks, 4);
  EXPECT_EQ(use.global_tokens, 256);
  EXPECT_EQ(use.replayed, exact_replay_rows(c));
  EXPECT_EQ(use.computed(), int64_t(text.size()) - 256);
  ASSERT_EQ(got, want);
  for (int k = 0; k < 8; ++k) {
    const int token = argmax(want);
    got = b.decode(token);
    want = cold.decode(token);
    ASSERT_EQ(got, want) << "decode step " << k;
  }

  Session shorter(*model, &tokenizer, Mode::Exact), shorter_cold(*model, &tokenizer, Mode::Exact);
  const std::vector<float> short_got = shorter.prefill_prompt(first(150), &cache, &use);
  EXPECT_EQ(use.cached(), 0);
  EXPECT_EQ(use.short_hit, 128);  // two blocks, no more than the replay's 181 rows
  EXPECT_EQ(short_got, shorter_cold.prefill(first(150)));

  // And a cache of the other mode is refused, changing nothing.
  KvCache other(c, options(Mode::Default));
  EXPECT_THROW(b.prefill_prompt(text, &other), Error);
  EXPECT_EQ(b.length(), int64_t(text.size()) + 8);
}

// Store writes run on the cache's writer thread: the blocks still queued when the cache is
// destroyed are written before it goes, so a restart finds every one.
TEST_F(PrefixCacheTest, QueuedStoreWritesOutliveTheCache) {
  TempDir dir("prefix_cache");
  KvCacheOptions o = options(Mode::Default);
  o.store_dir = dir.string();
  {
    KvCache cache(c, o);
    Session a(*model, &tokenizer);
    a.prefill_prompt(first(200), &cache);
  }
  KvCache reopened(c, o);
  EXPECT_EQ(reopened.stats().store->blocks, 3u);
}

// The persistent store serves a prefix after a restart (a new KvCache over the same directory),
// then the host tier serves it, the block copied up on the disk hit.
TEST_F(PrefixCacheTest, DiskThenHostAfterRestart) {
  TempDir dir("prefix_cache");
  const std::vector<int> prompt = first(300);
  {
    KvCacheOptions o = options(Mode::Default);
    o.store_dir = dir.string();
    KvCache cache(c, o);
    Session a(*model, &tokenizer);
    a.prefill_prompt(first(200), &cache);
    cache.flush();  // the writer's blocks on disk
    EXPECT_EQ(cache.stats().store->blocks, 3u);
  }
  KvCacheOptions o = options(Mode::Default);
  o.store_dir = dir.string();
  KvCache cache(c, o);
  Session b(*model, &tokenizer);
  PrefixUse use;
  b.prefill_prompt(prompt, &cache, &use);
  EXPECT_EQ(use.disk_blocks, 3);
  EXPECT_EQ(use.host_blocks, 0);
  EXPECT_EQ(use.global_tokens, 192);
  const double read = cache.stats().counters.store_read_seconds;  // three files read and checked
  EXPECT_GT(read, 0.0);
  clock.advance_ms(60'000);
  Session d(*model, &tokenizer);
  d.prefill_prompt(prompt, &cache, &use);
  EXPECT_EQ(use.host_blocks, 4);  // b stored its fourth block too
  EXPECT_EQ(use.disk_blocks, 0);
  EXPECT_EQ(cache.stats().counters.store_read_seconds, read);  // a host hit reads no file
  EXPECT_EQ(cache.stats().counters.disk_tokens, 192);
  EXPECT_EQ(cache.stats().counters.host_tokens, 256);
}

// After a restart the store's blocks are read over the host's cores: the run holds them in order,
// each as stored, and ends at the first block that fails its read (block 2, one byte of its file
// flipped), those before it served and the damaged file dropped.
TEST_F(PrefixCacheTest, DiskRunIsInOrderAndEndsAtADamagedBlock) {
  TempDir dir("prefix_cache");
  KvCacheOptions o = options(Mode::Default);
  o.store_dir = dir.string();
  const std::vector<int> prompt = first(300);
  std::vector<std::vector<uint8_t>> stored;
  std::vector<BlockKey> keys;
  {
    KvCache cache(c, o);
    Session a(*model, &tokenizer);
    a.prefill_prompt(prompt, &cache);
    cache.flush();
    const BlockRun run = cache.find_blocks(prompt, 4);
    for (const auto& block : run.blocks) stored.push_back(block->payload);
    keys = run.keys;
  }
  ASSERT_EQ(stored.size(), 4u);
  {
    KvCache cache(c, o);
    const BlockRun run = cache.find_blocks(prompt, 4);
    ASSERT_EQ(run.blocks.size(), 4u);
    for (size_t b = 0; b < 4; ++b) {
      EXPECT_TRUE(run.from_disk[b]) << b;
      EXPECT_EQ(run.keys[b], keys[b]) << b;
      EXPECT_EQ(run.blocks[b]->payload, stored[b]) << b;
    }
  }
  std::filesystem::path damaged;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir.path()))
    if (entry.path().filename().string().starts_with(to_hex(keys[2]))) damaged = entry.path();
  ASSERT_FALSE(damaged.empty());
  std::string bytes = read_text(damaged.string());
  bytes[bytes.size() / 2] = char(bytes[bytes.size() / 2] ^ 0x10);
  std::ofstream(damaged, std::ios::binary | std::ios::trunc) << bytes;

  KvCache cache(c, o);
  const BlockRun run = cache.find_blocks(prompt, 4);
  ASSERT_EQ(run.blocks.size(), 2u);
  for (size_t b = 0; b < 2; ++b) EXPECT_EQ(run.blocks[b]->payload, stored[b]) << b;
  EXPECT_EQ(cache.stats().store->dropped_files, 1u);
  EXPECT_FALSE(std::filesystem::exists(damaged));
  EXPECT_EQ(cache.find_blocks(prompt, 4).blocks.size(), 2u);  // now from the host cache, as far
}

// Replays of several requests run as one batch, with the same results as one by one.
TEST_F(PrefixCacheTest, BatchedPrefillsEqualOneByOne) {
  auto run = [&](bool batched) {
    KvCache cache(c, options(Mode::Default));
    Session seed(*model, &tokenizer);
    seed.prefill_prompt(first(200), &cache);
    clock.advance_ms(60'000);
    std::vector<std::vector<int>> prompts = {first(300), first(250), std::vector<int>(text.rbegin(), text.rbegin() + 90)};
    CpuExecutor executor(*model);  // one batch runs the sessions of one executor
    std::vector<Session> sessions;
    sessions.reserve(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) sessions.emplace_back(executor, &tokenizer);
    std::vector<std::vector<float>> logits;
    std::vector<PrefixUse> uses;
    if (batched) {
      std::vector<Session*> ptrs;
      std::vector<std::span<const int>> spans;
      for (size_t i = 0; i < prompts.size(); ++i) ptrs.push_back(&sessions[i]), spans.emplace_back(prompts[i]);
      logits = prefill_prompts(ptrs, spans, &cache, &uses);
    } else {
      for (size_t i = 0; i < prompts.size(); ++i) {
        PrefixUse use;
        logits.push_back(sessions[i].prefill_prompt(prompts[i], &cache, &use));
        uses.push_back(use);
      }
    }
    EXPECT_EQ(uses[0].global_tokens, 192);
    EXPECT_EQ(uses[1].global_tokens, 192);
    EXPECT_EQ(uses[2].cached(), 0);
    return logits;
  };
  EXPECT_EQ(run(true), run(false));
}

// Bad input is refused before anything changes: the session and the cache stay as they were.
TEST_F(PrefixCacheTest, BadPromptChangesNothing) {
  KvCache cache(c, options(Mode::Default));
  Session a(*model, &tokenizer);
  a.prefill_prompt(first(100), &cache);
  const KvCacheStats before = cache.stats();
  std::vector<int> bad = first(120);
  bad[110] = c.vocab_size;
  EXPECT_THROW(a.prefill_prompt(bad, &cache), Error);
  EXPECT_THROW(a.prefill_prompt(std::vector<int>{}, &cache), Error);
  EXPECT_EQ(a.length(), 100);
  EXPECT_EQ(a.tokens(), first(100));
  EXPECT_EQ(cache.stats().host.blocks, before.host.blocks);
  EXPECT_EQ(cache.stats().swa.entries, before.swa.entries);
}

// The truncation rule by hand (DESIGN §3): a query at i sees window keys in [max(s, i - W + 1), i],
// in the reference's slot order. W = 4, truncated at s = 5.
TEST(WindowRule, TruncationAtTheSegmentStart) {
  std::vector<int64_t> slots;
  const int64_t E = kEmptySlot;
  // A later call (positions from 6): W slots up to the query, oldest first.
  window_positions(7, 6, 3, 4, 5, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{E, 5, 6, 7}));  // 4 is before s
  window_positions(9, 6, 4, 4, 5, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{6, 7, 8, 9}));  // the whole window is past s
  window_positions(7, 6, 3, 4, 0, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{4, 5, 6, 7}));  // no truncation
  window_positions(1, 1, 3, 4, 0, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{E, E, 0, 1}));  // before position 0: empty, at the front
  // A first call (from position 0) of 6 rows: min(6, W) slots from max(0, i - W + 1), the future
  // ones empty at the end.
  window_positions(1, 0, 6, 4, 0, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{0, 1, E, E}));
  window_positions(5, 0, 6, 4, 3, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{E, 3, 4, 5}));  // 2 is before s = 3
  window_positions(1, 0, 2, 4, 0, slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{0, 1}));  // a 2-row call lists 2 slots
}
