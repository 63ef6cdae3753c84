// A sequence cut into the tiers' pieces (global blocks + tail) and put back together goes on
// exactly as the one that never left: the invariant "a hit with SWA present equals the cold run"
// (DESIGN §6) at the level of the state.
#include <gtest/gtest.h>

#include "base/error.h"
#include "engine/session.h"
#include "fixture.h"
#include "kv/prefix_key.h"
#include "kv/sequence_blocks.h"
#include "restore_check.h"
#include "test_util.h"

using namespace dsv41;
using namespace dsv41::test;

TEST(KvRestore, BlocksAndTailContinueExactly) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  const Config& c = model->config();
  Tokenizer tokenizer = Tokenizer::from_file(fixture_dir("v41-tiny") + "/tokenizer.json");
  Expected ex("v41-tiny");
  const int B = block_tokens(c);
  // prompt1: 67 tokens, an odd length, so the ratio-2 compressors hold an open group in the tail;
  // prompt2: 300 tokens, 4 complete blocks and an incomplete one.
  for (int p : {1, 2})
  for (Mode mode : {Mode::Default, Mode::Exact}) {
    std::vector<int64_t> t = ex.ints("prompt" + std::to_string(p) + ".tokens");
    std::vector<int64_t> d = ex.ints("prompt" + std::to_string(p) + ".decode.tokens");
    const std::vector<int> prompt(t.begin(), t.end()), next(d.begin(), d.end());
    Session cold(*model, &tokenizer, mode);
    cold.prefill(prompt);
    std::vector<std::vector<uint8_t>> blocks;
    for (int64_t b = 0; b < cold.length() / B; ++b) blocks.push_back(global_block(c, cold.state(), b, B));
    const std::vector<uint8_t> tail = sequence_tail(c, cold.state(), B);

    Session warm(*model, &tokenizer, mode);
    warm.resume(prompt, restore_sequence(c, test::payloads(blocks), B, &tail));
    EXPECT_EQ(warm.state().kv_bytes(), cold.state().kv_bytes());
    for (int token : next) EXPECT_EQ(warm.decode(token), cold.decode(token)) << "token " << token;
  }
}

TEST(KvRestore, GlobalBlocksAloneHoldTheGlobalKv) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  const Config& c = model->config();
  Tokenizer tokenizer = Tokenizer::from_file(fixture_dir("v41-tiny") + "/tokenizer.json");
  std::vector<int> prompt(200, 9);
  prompt[0] = 0;
  Session cold(*model, &tokenizer, Mode::Default);
  cold.prefill(prompt);
  const int B = block_tokens(c);
  std::vector<std::vector<uint8_t>> blocks;
  for (int64_t b = 0; b < 200 / B; ++b) blocks.push_back(global_block(c, cold.state(), b, B));
  // No tail: an SWA miss. The state holds the complete blocks' global KV, byte for byte.
  SequenceState restored = restore_sequence(c, test::payloads(blocks), B);
  EXPECT_EQ(restored.length, (200 / B) * B);
  for (int s : c.kv_source_layers) {
    const CompressedCache& a = restored.compressed.at(s);
    const CompressedCache& b = cold.state().compressed.at(s);
    ASSERT_EQ(a.entries, restored.length / c.compress_ratios[size_t(s)]);
    EXPECT_TRUE(std::equal(a.kv.begin(), a.kv.end(), b.kv.begin()));
    EXPECT_TRUE(std::equal(a.index_k.begin(), a.index_k.end(), b.index_k.begin()));
  }
  // A block of the wrong size, or a tail of another sequence, is refused.
  std::vector<std::vector<uint8_t>> bad = blocks;
  bad[0].pop_back();
  EXPECT_THROW(restore_sequence(c, test::payloads(bad), B), Error);
}

// The CPU executor's sequences restore from the tiers' pieces as materialize() does
// (tests/restore_check.h; tests/cuda/forward_device_test.cpp runs the same for CUDA).
TEST(KvRestore, ExecutorRestoresTheTiersPiecesAsTheHost) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  CpuExecutor executor(*model);
  expect_restores_as_the_host(model->config(), executor);
}
