// The KV bytes per token measured on a running sequence's buffers at V4.1-Flash's KV shapes
// (preset flash-kv: every layer, ratio, source, head and key size as released, at small widths):
// the report's 890 B of global KV per token, and W SWA-FP8 entries per layer.
#include <gtest/gtest.h>

#include <random>

#include "engine/session.h"
#include "model/random_checkpoint.h"
#include "numerics/codecs.h"
#include "test_util.h"

using namespace dsv41;

TEST(KvBytes, FlashShapesHold890BytesPerToken) {
  test::TempDir dir("kv_bytes");
  RandomCheckpointOptions options;
  options.quantized = true;
  write_random_checkpoint(preset("flash-kv"), dir.string(), options);
  auto model = Model::load(dir.string());
  const Config& c = model->config();
  Tokenizer tokenizer = Tokenizer::from_file((dir / "tokenizer.json").string());
  Session session(*model, &tokenizer);

  std::mt19937 rng(5);
  std::vector<int> prompt(256);
  for (int& t : prompt) t = 3 + int(rng() % uint32_t(c.vocab_size - 3));
  session.prefill(prompt);

  int64_t global = 0, swa = 0;
  for (const auto& [layer, cache] : session.state().compressed) global += int64_t(cache.kv.size() + cache.index_k.size());
  for (const auto& ring : session.state().window) swa += int64_t(ring.size());
  EXPECT_EQ(global, 890 * session.length());
  // A ring per layer with a window: the backbone's and DSpark's stages (docs/accounting.md).
  const int64_t rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  EXPECT_EQ(swa, rings * c.window_size * int64_t(swa_fp8::bytes(c.head_dim)));
  EXPECT_EQ(session.state().kv_bytes(), global + swa);
}
