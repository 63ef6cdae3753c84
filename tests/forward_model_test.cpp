// Loading a checkpoint into the forward, and the KV memory a sequence really holds.
#include <gtest/gtest.h>

#include "base/error.h"
#include "engine/session.h"
#include "model/accounting.h"
#include "model/random_checkpoint.h"
#include "numerics/codecs.h"
#include "test_util.h"

using namespace dsv41;

// A checkpoint with a vision tower loads (docs/vision.md): the tower, the span delimiters as fp32
// rows of the checkpoint's bf16 values, and every backbone gate's bias_vl.
TEST(ForwardModel, LoadsAVisionTower) {
  const Config c = preset("tiny-vision");
  test::TempDir dir("forward_model_test");
  write_random_checkpoint(c, dir.string(), {});
  const std::unique_ptr<Model> m = Model::load(dir.string());
  ASSERT_TRUE(m->has_vision());
  EXPECT_EQ(m->vision().blocks.size(), size_t(c.vision.n_layers));
  EXPECT_EQ(m->vision().aligner_w2.rows, c.dim);
  const Model::ImageDelimiters& d = m->image_delimiters();
  std::vector<float> start(static_cast<size_t>(c.dim));
  m->vision().image_start.row(0, start.data());
  EXPECT_EQ(d.start, start);
  EXPECT_EQ(d.newline.size(), size_t(c.dim));
  EXPECT_NE(d.newline, d.end);
  for (int l = 0; l < c.n_layers; ++l) {
    ASSERT_NE(m->layer(l).gate_bias_vl.data, nullptr) << l;
    EXPECT_EQ(m->layer(l).gate_bias_vl.cols, c.routed_experts(l)) << l;
  }
}

// The caches hold their real encoded formats: after N tokens a sequence holds exactly the
// accounting's global KV bytes per token × N in compressed entries (KV-FP4 main + MXFP4 index
// keys), plus the accounting's SWA bytes per sequence (one SWA-FP8 ring of W entries per layer with
// a window, DSpark's stages included), whatever N is.
TEST(ForwardModel, SequenceHoldsTheAccountedKvBytes) {
  test::TempDir dir("forward_model_test");
  write_random_checkpoint(preset("tiny"), dir.string(), {});
  auto model = Model::load(dir.string());
  const Config& c = model->config();
  Tokenizer tokenizer = Tokenizer::from_file(dir.string() + "/tokenizer.json");
  Session session(*model, &tokenizer);
  const int64_t ring = account(c, 1).kv.swa_bytes_per_sequence;
  ASSERT_GE(ring, int64_t(c.n_layers) * c.window_size * int64_t(swa_fp8::bytes(c.head_dim)));
  for (int64_t n : {64, 128}) {
    std::vector<int> ids(static_cast<size_t>(n - session.length()), 7);
    session.prefill(ids);
    const double global = account(c, 1).kv.global_bytes_per_token;
    EXPECT_EQ(double(session.state().kv_bytes() - ring), global * double(n)) << n << " tokens";
  }
}

// A batch advances each sequence by its own tokens, as if each ran alone.
TEST(ForwardModel, BatchEqualsSequencesRunAlone) {
  test::TempDir dir("forward_model_test");
  Config c = preset("tiny");
  c.engram_layer_ids.clear();  // hash ids are the session's business; this is the forward's
  c.engram_num_embeddings.clear();
  write_random_checkpoint(c, dir.string(), {});
  auto model = Model::load(dir.string());
  const std::vector<int> a = {0, 11, 12, 13, 14}, b = {0, 99, 98};
  CpuExecutor executor(*model);
  std::unique_ptr<Sequence> sa = executor.new_sequence(), sb = executor.new_sequence();
  SequenceState alone_a(model->config()), alone_b(model->config());
  std::vector<std::vector<float>> batched = executor.forward_batch({{sa.get(), a}, {sb.get(), b}});
  EXPECT_EQ(batched[0], forward(*model, alone_a, a, nullptr));
  EXPECT_EQ(batched[1], forward(*model, alone_b, b, nullptr));
  EXPECT_EQ(sa->length(), 5);
  EXPECT_EQ(sb->length(), 3);
}
