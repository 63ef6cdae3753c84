// Decoder bounded replay (DESIGN §3, report §3.2.2): in default mode a prompt runs the encoder on
// every position and the decoder on its last min(W, P) positions only, with the decoder's sliding
// windows truncated at the segment start s.
#include <gtest/gtest.h>

#include "engine/session.h"
#include "fixture.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

// The prompt's last logits and the teacher-forced decode steps' logits of fixture v41-tiny.
std::vector<float> run(const Model& model, const Expected& ex, int prompt, const ForwardOptions& prefill_options) {
  const Config& c = model.config();
  const std::string p = "prompt" + std::to_string(prompt) + ".";
  std::vector<int64_t> t = ex.ints(p + "tokens"), h = ex.ints(p + "prefill.engram_hash");
  std::vector<int64_t> dt = ex.ints(p + "decode.tokens"), dh = ex.ints(p + "decode.engram_hash");
  const std::vector<int> tokens(t.begin(), t.end());
  const int64_t per_token = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
  SequenceState state(c);
  std::vector<float> out = forward(model, state, tokens, h.data(), prefill_options);
  for (size_t k = 0; k < dt.size(); ++k) {
    const int token = int(dt[k]);
    std::vector<float> l = forward(model, state, std::span<const int>(&token, 1), dh.data() + k * per_token);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

}  // namespace

// With P <= W the decoder replays the whole prompt: default mode is exact mode, to the bit.
TEST(BoundedReplay, ShortPromptsAreNotCut) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  Expected ex("v41-tiny");
  ForwardOptions bounded;
  bounded.decoder_from = 0;  // P = 5 <= W = 16: s = P - min(W, P) = 0
  EXPECT_EQ(run(*model, ex, 0, bounded), run(*model, ex, 0, ForwardOptions{}));
}

// With P > W the only change bounded replay makes is the truncation: running the decoder on every
// prompt row with its windows cut at s gives the same logits as dropping the rows before s (the
// decoder's global KV comes from the encoder output either way). To the bit: the two runs multiply
// different numbers of rows at once, but every product's sum depends on its own row alone
// (backend/cpu/gemm.h), and the kept rows list the same window entries in the same order.
TEST(BoundedReplay, DroppingRowsEqualsTruncatingTheirWindows) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  Expected ex("v41-tiny");
  const int64_t P = int64_t(ex.ints("prompt1.tokens").size()), W = model->config().window_size;
  ForwardOptions dropped, truncated;
  dropped.decoder_from = truncated.decoder_from = P - W;
  truncated.keep_replayed_rows = true;
  std::vector<float> a = run(*model, ex, 1, dropped), b = run(*model, ex, 1, truncated);
  LogitStats s = compare_logits(a, b, model->config().vocab_size);
  std::printf("dropped vs truncated: max %.2e mean %.2e over %d rows\n", s.max, s.mean, s.rows);
  EXPECT_EQ(a, b);

  // And the truncation does change the result: exact mode sees the decoder windows whole.
  LogitStats e = compare_logits(a, run(*model, ex, 1, ForwardOptions{}), model->config().vocab_size);
  std::printf("default vs exact (P = %ld, W = %ld): max %.4f mean %.4f argmax agreement %.3f\n", long(P), long(W), e.max,
              e.mean, e.argmax_agree);
  EXPECT_GT(e.max, 0.0);
}

// The work: every prompt token through the encoder, min(W, P) through the decoder.
TEST(BoundedReplay, SessionReportsTheWorkSaved) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  Tokenizer tokenizer = Tokenizer::from_file(fixture_dir("v41-tiny") + "/tokenizer.json");
  const int64_t W = model->config().window_size;
  std::vector<int> prompt(100, 7);
  prompt[0] = 0;
  Session bounded(*model, &tokenizer, Mode::Default), exact(*model, &tokenizer, Mode::Exact);
  bounded.prefill(prompt);
  exact.prefill(prompt);
  EXPECT_EQ(bounded.work().encoder_tokens, 100);
  EXPECT_EQ(bounded.work().decoder_tokens, W);
  EXPECT_EQ(exact.work().decoder_tokens, 100);
  EXPECT_EQ(bounded.state().decoder_window_floor, 100 - W);
  // The decoder's global KV is the same either way, to the byte: it comes from the encoder output.
  const CompressedCache& a = bounded.state().compressed.at(model->config().decoder_start());
  const CompressedCache& b = exact.state().compressed.at(model->config().decoder_start());
  EXPECT_EQ(a.entries, 100);
  EXPECT_EQ(a.kv, b.kv);
  EXPECT_EQ(a.index_k, b.index_k);
  // Decode steps run every layer.
  bounded.decode(5);
  EXPECT_EQ(bounded.work().decoder_tokens, W + 1);
}
