// Images in the text forward and the session, on the CPU executor (docs/vision.md §7-§9), on
// random checkpoints of the tiny-vision preset:
//  * the routing op: bias_vl chooses on image rows, the weights come from the unbiased scores;
//  * an image-span row's embedding is the row given for it, and nothing else changes (a
//    checkpoint whose bias_vl is its bias and without Engram runs an image prompt exactly as the
//    text prompt whose token rows are those embeddings);
//  * every backbone gate chooses with bias_vl on span rows and with bias on text rows;
//  * Engram leaves span rows alone: their hash ids do not matter, a text row's do;
//  * the session's span layout (delimiters, aligner rows in reading order), its Engram ids (DEAD
//    look-back), and the prefix cache: the same image is served from the tiers without being
//    encoded again, another image with the same ids is not.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <set>

#include "base/error.h"
#include "backend/cpu/moe.h"
#include "engine/chat_format.h"
#include "engine/prompt_image.h"
#include "engine/scheduler.h"
#include "engine/session.h"
#include "forward/forward.h"
#include "forward/model.h"
#include "forward/vision_cpu.h"
#include "model/checkpoint.h"
#include "model/random_checkpoint.h"
#include "error_of.h"
#include "ops_util.h"
#include "test_util.h"

namespace dsv41 {
namespace {

// A seeded random picture of w x h pixels.
RgbImage picture(int w, int h, uint32_t seed) {
  RgbImage im(w, h);
  uint32_t x = seed * 2654435761u + 1;
  for (uint8_t& v : im.pixels) {
    x = x * 1664525u + 1013904223u;
    v = uint8_t(x >> 24);
  }
  return im;
}

// Copies checkpoint `from` into `to`, every tensor through `edit` (name, dtype, bytes).
void rewrite(const std::string& from, const std::string& to,
             const std::function<void(const std::string&, DType, std::vector<uint8_t>&)>& edit) {
  std::filesystem::create_directories(to);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    if (std::filesystem::exists(from + "/" + f)) std::filesystem::copy_file(from + "/" + f, to + "/" + f);
  const Checkpoint in = Checkpoint::open(from);
  ShardedWriter out(to, size_t(1) << 40);
  for (const std::string& name : in.names()) {
    const TensorView& t = in.get(name);
    std::vector<uint8_t> bytes(t.data, t.data + t.nbytes);
    edit(name, t.dtype, bytes);
    out.add(name, t.dtype, t.shape, std::move(bytes));
  }
  out.finish();
}

void set_f32(std::vector<uint8_t>& bytes, const std::vector<float>& values) {
  ASSERT_EQ(bytes.size(), values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
}

std::vector<float> embed_row(const Model& m, int token) {
  std::vector<float> row(static_cast<size_t>(m.config().dim));
  m.embed().row(token, row.data());
  return row;
}

class ForwardImage : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("forward_image");
    RandomCheckpointOptions o;
    o.seed = 11;
    write_random_checkpoint(preset("tiny-vision"), (*dir_ / "vision").string(), o);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  static test::TempDir* dir_;
};
test::TempDir* ForwardImage::dir_ = nullptr;

// --- the routing op ---------------------------------------------------------------------------

TEST(RouteOp, ImageRowsChooseWithBiasVlAndWeighByTheUnbiasedScores) {
  // Four experts whose gate logits are the row itself (an identity gate): scores sqrt(softplus(x)).
  std::vector<float> eye(16, 0.0f);
  for (int e = 0; e < 4; ++e) eye[size_t(e * 5)] = 1.0f;
  const test::OwnedWeight gate = test::make_weight(WeightFormat::BF16, eye, 4, 4);
  const test::OwnedWeight bias = test::make_weight(WeightFormat::F32, {10, 10, 0, 0}, 1, 4);
  const test::OwnedWeight vl = test::make_weight(WeightFormat::F32, {0, 0, 10, 10}, 1, 4);
  const Weight bias_vl = vl.view();
  const std::vector<float> x = {0.5f, 1.0f, 1.5f, 2.0f, 0.5f, 1.0f, 1.5f, 2.0f};  // two equal rows
  const std::vector<uint8_t> image_rows = {0, 1};
  GateOptions opt;
  opt.topk = 2;
  opt.route_scale = 1.5f;
  std::vector<int32_t> experts(4);
  std::vector<float> weights(4);
  route(x.data(), 2, gate.view(), bias.view(), opt, experts.data(), weights.data(), nullptr, nullptr, &bias_vl,
        image_rows.data());
  auto score = [](double v) { return std::sqrt(std::log1p(std::exp(v))); };
  // The text row takes experts 1 and 0 (bias 10, the larger score first), the image row 3 and 2.
  EXPECT_EQ(experts, (std::vector<int32_t>{1, 0, 3, 2}));
  const double s0 = score(0.5), s1 = score(1.0), s2 = score(1.5), s3 = score(2.0);
  const std::vector<double> expected = {1.5 * s1 / (s0 + s1), 1.5 * s0 / (s0 + s1), 1.5 * s3 / (s2 + s3), 1.5 * s2 / (s2 + s3)};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(weights[i], expected[i], 1e-6) << i;  // fp32 of O(1) values
  // Without image rows the bias alone chooses.
  route(x.data(), 2, gate.view(), bias.view(), opt, experts.data(), weights.data());
  EXPECT_EQ(experts, (std::vector<int32_t>{1, 0, 1, 0}));
  EXPECT_THROW(route(x.data(), 2, gate.view(), bias.view(), opt, experts.data(), weights.data(), nullptr, nullptr, nullptr,
                     image_rows.data()),
               Error);
}

// --- the forward ------------------------------------------------------------------------------

// Without Engram, and with bias_vl equal to bias, a span row differs from a text row only by its
// embedding: an image prompt whose span rows take the embeddings of tokens t_i is, bit for bit,
// the text prompt with t_i at those rows.
TEST_F(ForwardImage, ASpanRowRunsOnTheEmbeddingGivenForIt) {
  Config c = preset("tiny-vision");
  c.engram_layer_ids.clear();
  c.engram_num_embeddings.clear();
  RandomCheckpointOptions o;
  o.seed = 12;
  write_random_checkpoint(c, path("noengram"), o);
  const Checkpoint source = Checkpoint::open(path("noengram"));
  rewrite(path("noengram"), path("noengram-same-bias"), [&](const std::string& name, DType, std::vector<uint8_t>& bytes) {
    if (!name.ends_with("gate.bias_vl")) return;
    const TensorView& bias = source.get(name.substr(0, name.size() - 3));  // the layer's gate.bias
    bytes.assign(bias.data, bias.data + bias.nbytes);
  });
  const std::unique_ptr<Model> m = Model::load(path("noengram-same-bias"));
  const std::vector<int> text = {5, 9, 17, 33, 2, 8, 11, 40, 3};
  std::vector<int> with_span = text;
  std::vector<std::vector<float>> rows;
  std::vector<const float*> spans(text.size(), nullptr);
  for (size_t r = 2; r < 5; ++r) rows.push_back(embed_row(*m, text[r]));
  for (size_t r = 2; r < 5; ++r) {
    with_span[r] = int(c.image_token_id);
    spans[r] = rows[r - 2].data();
  }
  ForwardOptions all;
  all.all_logits = true;
  SequenceState a(m->config()), b(m->config());
  const std::vector<float> expected = forward(*m, a, text, nullptr, all);
  ForwardOptions image = all;
  image.span_embeddings = spans.data();
  EXPECT_EQ(forward(*m, b, with_span, nullptr, image), expected);

  // Another row's embedding at position 3 changes the rows from 3 on, and not those before.
  const std::vector<float> other = embed_row(*m, 100);
  spans[3] = other.data();
  SequenceState d(m->config());
  const std::vector<float> changed = forward(*m, d, with_span, nullptr, image);
  const size_t V = size_t(c.vocab_size);
  EXPECT_TRUE(std::equal(changed.begin(), changed.begin() + 3 * V, expected.begin()));
  EXPECT_FALSE(std::equal(changed.begin() + 3 * V, changed.begin() + 4 * V, expected.begin() + 3 * V));
}

// A checkpoint whose bias_vl strongly prefers experts 2 and 5: every backbone gate gives those
// two to every span row; text rows rank by the checkpoint's small bias (recorded scores far from
// ±100), and text rows before the span route as in the text-only prompt.
TEST_F(ForwardImage, SpanRowsRouteWithBiasVl) {
  rewrite(path("vision"), path("vision-forced-vl"), [](const std::string& name, DType dtype, std::vector<uint8_t>& bytes) {
    if (!name.ends_with("gate.bias_vl") || name.starts_with("mtp.")) return;
    ASSERT_EQ(dtype, DType::F32);
    std::vector<float> v(bytes.size() / 4, -100.0f);
    v[2] = v[5] = 100.0f;
    set_f32(bytes, v);
  });
  const std::unique_ptr<Model> m = Model::load(path("vision-forced-vl"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision-forced-vl") + "/tokenizer.json");
  const std::shared_ptr<const EngramHasher> hasher = engram_hasher(c, &tokenizer);
  const std::vector<int> text = {5, 9, 17, 33, 2, 8, 11, 40, 3, 7};
  const std::set<size_t> span = {3, 4, 5, 6};
  std::vector<int> tokens = text;
  std::vector<uint8_t> marks(text.size(), 0);
  std::vector<const float*> spans(text.size(), nullptr);
  const std::vector<float> some_row = embed_row(*m, 77);
  for (size_t r : span) tokens[r] = int(c.image_token_id), marks[r] = 1, spans[r] = some_row.data();
  auto ids_of = [&](const std::vector<int>& t, const std::vector<uint8_t>& k) {
    std::vector<int64_t> ids(t.size() * size_t(hasher->n_layers() * hasher->columns()));
    EngramHistory h;
    hasher->hash(t, k, h, ids.data());
    return ids;
  };
  const std::vector<int64_t> image_ids = ids_of(tokens, marks), text_ids = ids_of(text, {});

  Trace image_trace, text_trace;
  ForwardOptions options;
  options.trace = &image_trace;
  options.span_embeddings = spans.data();
  SequenceState a(c), b(c);
  forward(*m, a, tokens, image_ids.data(), options);
  ForwardOptions plain;
  plain.trace = &text_trace;
  forward(*m, b, text, text_ids.data(), plain);

  const int k = c.n_activated_experts;
  const int64_t E = c.n_routed_experts;
  for (int l = 0; l < c.n_layers; ++l) {
    const std::vector<int32_t>& experts = image_trace.route_experts[size_t(l)];
    const std::vector<float>& scores = image_trace.route_scores[size_t(l)];
    for (size_t r = 0; r < text.size(); ++r) {
      const std::set<int32_t> chosen(experts.begin() + int64_t(r) * k, experts.begin() + int64_t(r + 1) * k);
      if (span.count(r)) {
        EXPECT_EQ(chosen, (std::set<int32_t>{2, 5})) << "layer " << l << " row " << r;
        continue;
      }
      for (int64_t e = 0; e < E; ++e) EXPECT_LT(std::abs(scores[size_t(int64_t(r) * E + e)]), 50.0f) << "layer " << l << " row " << r;
      if (r < *span.begin()) {
        EXPECT_TRUE(std::equal(experts.begin() + int64_t(r) * k, experts.begin() + int64_t(r + 1) * k,
                               text_trace.route_experts[size_t(l)].begin() + int64_t(r) * k))
            << "layer " << l << " row " << r;
      }
    }
  }
}

// Engram's gate is shut on span rows: whatever hash ids they carry, every logit is the same; a
// text row's ids do change them.
TEST_F(ForwardImage, EngramLeavesSpanRowsAlone) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  ASSERT_TRUE(c.has_engram());
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  const std::shared_ptr<const EngramHasher> hasher = engram_hasher(c, &tokenizer);
  std::vector<int> tokens = {5, 9, 17, 0, 0, 0, 11, 40};
  std::vector<uint8_t> marks(tokens.size(), 0);
  const std::vector<float> row = embed_row(*m, 77);
  std::vector<const float*> spans(tokens.size(), nullptr);
  for (size_t r = 3; r < 6; ++r) tokens[r] = int(c.image_token_id), marks[r] = 1, spans[r] = row.data();
  const int64_t per_row = int64_t(hasher->n_layers()) * hasher->columns();
  std::vector<int64_t> ids(tokens.size() * size_t(per_row));
  EngramHistory h;
  hasher->hash(tokens, marks, h, ids.data());

  ForwardOptions options;
  options.all_logits = true;
  options.span_embeddings = spans.data();
  auto run = [&](const std::vector<int64_t>& engram_ids) {
    SequenceState s(c);
    return forward(*m, s, tokens, engram_ids.data(), options);
  };
  const std::vector<float> expected = run(ids);
  // Span rows 3..5 take the (valid) hash ids of text rows 0..2.
  std::vector<int64_t> swapped = ids;
  std::copy_n(ids.begin(), 3 * per_row, swapped.begin() + 3 * per_row);
  ASSERT_NE(swapped, ids);
  EXPECT_EQ(run(swapped), expected);
  // Text row 7 taking row 0's ids changes its logits.
  std::vector<int64_t> text_swapped = ids;
  std::copy_n(ids.begin(), per_row, text_swapped.begin() + 7 * per_row);
  ASSERT_NE(text_swapped, ids);
  EXPECT_NE(run(text_swapped), expected);
}

TEST_F(ForwardImage, ATextOnlyModelRefusesSpanRows) {
  Config c = preset("tiny");
  RandomCheckpointOptions o;
  write_random_checkpoint(c, path("text"), o);
  const std::unique_ptr<Model> m = Model::load(path("text"));
  const std::vector<float> row(size_t(c.dim), 0.0f);
  const std::vector<const float*> spans = {row.data()};
  ForwardOptions options;
  options.span_embeddings = spans.data();
  SequenceState s(c);
  const std::vector<int64_t> ids(size_t(c.engram_layer_ids.size() * c.engram_hash_columns()), 0);
  EXPECT_THROW(forward(*m, s, std::vector<int>{5}, ids.data(), options), Error);
}

// --- the session --------------------------------------------------------------------------------

struct ImagePrompt {
  std::vector<int> tokens;
  std::vector<PromptImage> images;
};

// [before...] + the image's span + [after...]
ImagePrompt image_prompt(const Config& c, const std::vector<int>& before, std::shared_ptr<const ImageInput> image,
                         const std::vector<int>& after) {
  ImagePrompt p;
  p.tokens = before;
  p.images.push_back(PromptImage{int64_t(before.size()), image});
  p.tokens.insert(p.tokens.end(), size_t(image->plan.span_tokens()), int(c.image_token_id));
  p.tokens.insert(p.tokens.end(), after.begin(), after.end());
  return p;
}

// The span's rows take, in order: IMAGE_START, per line of the aligner grid its n_llm_w rows
// then IMAGE_NEW_LINE, IMAGE_END (image_processor.py's layout); the Engram ids of the span are
// all-pad n-grams, and the text after it starts its n-grams afresh (DEAD look-back), in the
// prompt and in the decode steps that follow.
TEST_F(ForwardImage, SessionPlacesTheSpanAndMarksItDead) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  const std::shared_ptr<const ImageInput> image = prepare_image(picture(112, 70, 1), c);
  ASSERT_EQ(image->plan.n_llm_h, 2);  // docs/vision.md §2's table: 112 x 70 → 2 x 3 tokens, a span of 10
  ASSERT_EQ(image->plan.n_llm_w, 3);
  const ImagePrompt p = image_prompt(c, {5, 9, 17}, image, {21, 22});
  Session session(*m, &tokenizer, Mode::Default);
  session.begin_prompt(p.tokens, nullptr, std::nullopt, false, p.images);
  const BatchItem item = session.next_chunk(int64_t(p.tokens.size()));
  ASSERT_NE(item.options.span_embeddings, nullptr);

  const std::vector<std::vector<float>> aligner =
      encode_images(c, m->vision(), {VisionImage{image->patches.data(), image->plan.n_vit_h, image->plan.n_vit_w}});
  const int64_t d = c.dim;
  const Model::ImageDelimiters& delim = m->image_delimiters();
  std::vector<std::vector<float>> expected = {delim.start};
  for (int line = 0; line < 2; ++line) {
    for (int col = 0; col < 3; ++col) {
      const float* r = aligner[0].data() + (line * 3 + col) * d;
      expected.emplace_back(r, r + d);
    }
    expected.push_back(delim.newline);
  }
  expected.push_back(delim.end);
  for (size_t r = 0; r < p.tokens.size(); ++r) {
    const float* got = item.options.span_embeddings[r];
    if (r < 3 || r >= 13) {
      EXPECT_EQ(got, nullptr) << r;
      continue;
    }
    ASSERT_NE(got, nullptr) << r;
    EXPECT_EQ(std::vector<float>(got, got + d), expected[r - 3]) << "span row " << r - 3;
  }

  // Engram ids: what a fresh sequence gives (the hasher's own look-back stops at its start).
  const std::shared_ptr<const EngramHasher> hasher = engram_hasher(c, &tokenizer);
  const int64_t per_row = int64_t(hasher->n_layers()) * hasher->columns();
  auto fresh = [&](const std::vector<int>& t) {
    std::vector<int64_t> ids(t.size() * size_t(per_row));
    EngramHistory h;
    hasher->hash(t, {}, h, ids.data());
    return ids;
  };
  auto row_ids = [&](const int64_t* ids, size_t r) { return std::vector<int64_t>(ids + r * per_row, ids + (r + 1) * per_row); };
  const std::vector<int64_t> pad = fresh({int(c.engram_pad_id)});  // all-pad n-grams
  for (size_t r = 3; r < 13; ++r) EXPECT_EQ(row_ids(item.engram_ids, r), pad) << r;
  const std::vector<int64_t> after = fresh({21, 22});
  EXPECT_EQ(row_ids(item.engram_ids, 13), row_ids(after.data(), 0));
  EXPECT_EQ(row_ids(item.engram_ids, 14), row_ids(after.data(), 1));
  EXPECT_EQ(row_ids(item.engram_ids, 2), row_ids(fresh({5, 9, 17}).data(), 2)) << "text before the span looks back as usual";

  session.executor().forward_batch({item});
  session.ran();
  EXPECT_EQ(session.work().images_encoded, 1);
  const BatchItem decode = session.next_decode(23);
  EXPECT_EQ(decode.options.span_embeddings, nullptr);
  EXPECT_EQ(row_ids(decode.engram_ids, 0), row_ids(fresh({21, 22, 23}).data(), 2)) << "the decode step's look-back stops at the span";
}

// Exact mode, so that a continuation from the SWA pool is bit for bit a cold run: a turn that
// extends an image prompt is served from the tiers, the image not encoded again; the same ids
// with another image are not.
TEST_F(ForwardImage, PrefixCacheKnowsTheImage) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  const std::shared_ptr<const ImageInput> a = prepare_image(picture(90, 130, 2), c), b = prepare_image(picture(90, 130, 3), c);
  ASSERT_EQ(a->plan.span_tokens(), b->plan.span_tokens());
  const ImagePrompt first = image_prompt(c, {5, 9, 17}, a, {21, 22, 23});
  ImagePrompt second = first;
  for (int t : {30, 31, 32, 33}) second.tokens.push_back(t);
  ImagePrompt other = second;
  other.images[0].image = b;

  KvCacheOptions options;
  options.mode = mode_name(Mode::Exact);
  KvCache cache(c, options);
  Session turn1(*m, &tokenizer, Mode::Exact);
  turn1.prefill_prompt(first.tokens, &cache, nullptr, first.images);
  EXPECT_EQ(turn1.work().images_encoded, 1);

  Session turn2(*m, &tokenizer, Mode::Exact), cold(*m, &tokenizer, Mode::Exact), other_turn(*m, &tokenizer, Mode::Exact);
  PrefixUse use;
  const std::vector<float> logits = turn2.prefill_prompt(second.tokens, &cache, &use, second.images);
  EXPECT_EQ(use.swa_tokens, int64_t(first.tokens.size()));
  EXPECT_EQ(turn2.work().images_encoded, 0) << "the image's span was served by the tiers";
  EXPECT_EQ(logits, cold.prefill_prompt(second.tokens, nullptr, nullptr, second.images));

  const std::vector<float> with_b = other_turn.prefill_prompt(other.tokens, &cache, &use, other.images);
  EXPECT_EQ(use.cached(), 0) << "another image behind the same ids";
  EXPECT_EQ(other_turn.work().images_encoded, 1);
  EXPECT_NE(with_b, logits);
}

// A global-KV hit in exact mode replays the last exact_replay_rows(config) = 121 positions below
// the hit through every layer: here from the middle of the image's span, so the image is encoded
// again for the span rows the replay reruns, and the result is a cold run's bit for bit.
TEST_F(ForwardImage, AnExactReplayStartsInsideTheSpan) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  const std::shared_ptr<const ImageInput> a = prepare_image(picture(90, 130, 8), c);  // a span of 18
  std::vector<int> after;
  for (int t = 0; t < 120; ++t) after.push_back(100 + t);
  const ImagePrompt p = image_prompt(c, {5, 9, 17}, a, after);  // 141 tokens: 2 blocks of 64, the span in the first
  ASSERT_EQ(exact_replay_rows(c), 121);
  KvCacheOptions options;
  options.mode = mode_name(Mode::Exact);
  KvCache cache(c, options);
  Session first(*m, &tokenizer, Mode::Exact), again(*m, &tokenizer, Mode::Exact), cold(*m, &tokenizer, Mode::Exact);
  first.prefill_prompt(p.tokens, &cache, nullptr, p.images);
  PrefixUse use;
  const std::vector<float> logits = again.prefill_prompt(p.tokens, &cache, &use, p.images);
  EXPECT_EQ(use.global_tokens, 128);
  EXPECT_EQ(use.replayed, 121);  // from position 7, inside the span [3, 21)
  EXPECT_EQ(again.work().images_encoded, 1);
  EXPECT_EQ(logits, cold.prefill_prompt(p.tokens, nullptr, nullptr, p.images));
}

TEST_F(ForwardImage, PromptImagesAreCheckedAgainstThePrompt) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  const std::shared_ptr<const ImageInput> a = prepare_image(picture(60, 60, 4), c);
  ImagePrompt p = image_prompt(c, {5, 9}, a, {21});
  Session session(*m, &tokenizer, Mode::Default);
  ImagePrompt shifted = p;
  shifted.images[0].start = 1;  // position 1 holds a text token
  EXPECT_THROW(session.begin_prompt(shifted.tokens, nullptr, std::nullopt, false, shifted.images), Error);
  ImagePrompt outside = p;
  outside.tokens.resize(5);  // the span cut short
  EXPECT_THROW(session.begin_prompt(outside.tokens, nullptr, std::nullopt, false, outside.images), Error);
  EXPECT_NO_THROW(session.begin_prompt(p.tokens, nullptr, std::nullopt, false, p.images));
}

// The scheduler: a request with an image gets what a lone session gets, also when its span is cut
// between prefill chunks (a step budget of 8 tokens); its next turn continues the idle sequence on
// the device; the same ids with another image do not, and a misplaced image is refused.
TEST_F(ForwardImage, SchedulerServesImagePrompts) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  CpuExecutor executor(*m);
  const std::shared_ptr<const ImageInput> a = prepare_image(picture(90, 130, 6), c), b = prepare_image(picture(90, 130, 7), c);
  const ImagePrompt p = image_prompt(c, {5, 9, 17}, a, {21, 22, 23});
  auto greedy_alone = [&](const ImagePrompt& q, int n) {
    Session s(executor, &tokenizer, Mode::Default);
    std::vector<float> logits = s.prefill(q.tokens, q.images);
    std::vector<int> out;
    for (int k = 0; k < n; ++k) {
      out.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (k + 1 < n) logits = s.decode(out.back());
    }
    return out;
  };
  auto run = [](Scheduler& scheduler, const ImagePrompt& q, int n) {
    GenerationRequest r;
    r.prompt = q.tokens;
    r.images = q.images;
    r.max_tokens = n;
    r.sampling.temperature = 0;
    std::shared_ptr<Generation> g = scheduler.submit(r);
    std::pair<PrefixUse, std::vector<int>> out;
    for (;;) {
      GenerationEvent e = g->next();
      if (e.kind == GenerationEvent::Kind::Prefilled) out.first = e.use;
      if (e.kind == GenerationEvent::Kind::Token) out.second.push_back(e.token.token);
      if (e.kind == GenerationEvent::Kind::Finished) {
        EXPECT_EQ(e.finish, FinishKind::Length) << e.error;
        return out;
      }
    }
  };
  KvCacheOptions options;
  options.mode = mode_name(Mode::Default);
  KvCache cache(c, options);
  SchedulerOptions so;
  so.step_tokens = 8;
  Scheduler scheduler(executor, &tokenizer, Mode::Default, &cache, so);
  const auto [use, reply] = run(scheduler, p, 3);
  EXPECT_EQ(use.prompt_tokens, int64_t(p.tokens.size()));
  EXPECT_EQ(reply, greedy_alone(p, 3));

  ImagePrompt next = p;
  next.tokens.insert(next.tokens.end(), reply.begin(), reply.end());
  for (int t : {40, 41}) next.tokens.push_back(t);
  EXPECT_EQ(run(scheduler, next, 2).first.device_tokens, int64_t(p.tokens.size() + reply.size()) - 1);
  ImagePrompt other = next;
  other.images[0].image = b;
  const auto [other_use, other_reply] = run(scheduler, other, 2);
  EXPECT_EQ(other_use.cached(), 0);
  EXPECT_EQ(other_reply, greedy_alone(other, 2));

  GenerationRequest misplaced;
  misplaced.prompt = p.tokens;
  misplaced.images = {PromptImage{1, a}};
  EXPECT_THROW(scheduler.submit(misplaced), Error);
}

// An executor without the vision tower (takes_images false: neither the CPU's nor the CUDA one's)
// is refused a prompt with images by the scheduler and the session, by name, before anything runs.
class NoVisionExecutor final : public Executor {
 public:
  explicit NoVisionExecutor(const Model& m) : cpu_(m) {}
  const Model& model() const override { return cpu_.model(); }
  std::string name() const override { return "no-vision"; }
  std::unique_ptr<Sequence> new_sequence() override { return cpu_.new_sequence(); }
  std::vector<std::vector<float>> forward_batch(const std::vector<BatchItem>& batch) override { return cpu_.forward_batch(batch); }

 private:
  CpuExecutor cpu_;
};

TEST_F(ForwardImage, AnExecutorWithoutTheTowerRefusesImages) {
  const std::unique_ptr<Model> m = Model::load(path("vision"));
  const Config& c = m->config();
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  NoVisionExecutor executor(*m);
  EXPECT_FALSE(executor.takes_images());
  EXPECT_TRUE(CpuExecutor(*m).takes_images());
  const ImagePrompt p = image_prompt(c, {5, 9}, prepare_image(picture(60, 60, 4), c), {21});
  const std::string says = "no-vision executor: expected an executor with the vision tower for images";
  Session session(executor, &tokenizer, Mode::Default);
  EXPECT_NE(test::error_of([&] { session.begin_prompt(p.tokens, nullptr, std::nullopt, false, p.images); }).find(says), std::string::npos);
  Scheduler scheduler(executor, &tokenizer, Mode::Default, nullptr, SchedulerOptions{});
  GenerationRequest r;
  r.prompt = p.tokens;
  r.images = p.images;
  EXPECT_NE(test::error_of([&] { scheduler.submit(r); }).find(says), std::string::npos);
}

// prepare_vl_inputs's expansion: the text between placeholders through the tokenizer (special
// tokens on the first piece only), each placeholder its image's span; as many images as
// placeholders, or an error saying both counts.
TEST_F(ForwardImage, EncodeWithImagesPlacesEachSpan) {
  const Config c = preset("tiny-vision");
  const Tokenizer tokenizer = Tokenizer::from_file(path("vision") + "/tokenizer.json");
  const std::shared_ptr<const ImageInput> a = prepare_image(picture(112, 70, 9), c), b = prepare_image(picture(60, 60, 10), c);
  const std::string ph(chat_token::kImage);
  std::vector<PromptImage> placed;
  const std::vector<int> ids = encode_with_images(tokenizer, "look " + ph + " and" + ph, true, std::vector{a, b}, c, placed);
  std::vector<int> expected = tokenizer.encode("look ", true);
  const int64_t at_a = int64_t(expected.size());
  expected.insert(expected.end(), size_t(a->plan.span_tokens()), int(c.image_token_id));
  const std::vector<int> middle = tokenizer.encode(" and", false);
  expected.insert(expected.end(), middle.begin(), middle.end());
  const int64_t at_b = int64_t(expected.size());
  expected.insert(expected.end(), size_t(b->plan.span_tokens()), int(c.image_token_id));
  EXPECT_EQ(ids, expected);
  ASSERT_EQ(placed.size(), 2u);
  EXPECT_EQ(placed[0].start, at_a);
  EXPECT_EQ(placed[1].start, at_b);
  EXPECT_EQ(placed[1].image, b);
  EXPECT_EQ(test::error_of([&] { encode_with_images(tokenizer, "look " + ph, false, std::vector{a, b}, c, placed); }),
            "prompt: expected 2 image placeholders <｜deepseek_image｜>, one per image, found 1");
}

// The content hash is of the picture: the same pixels share it, one changed pixel does not.
TEST_F(ForwardImage, ImageContentHashIsThePictures) {
  const Config c = preset("tiny-vision");
  RgbImage im = picture(40, 30, 5);
  const BlockKey same = prepare_image(im, c)->content;
  EXPECT_EQ(prepare_image(picture(40, 30, 5), c)->content, same);
  im.pixels[100] ^= 1;
  EXPECT_NE(prepare_image(im, c)->content, same);
  EXPECT_THROW(prepare_image(im, preset("tiny")), ImageError);
}

}  // namespace
}  // namespace dsv41
