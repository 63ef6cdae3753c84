// Decoder bounded replay simulated in training (TrainModel::forward's served calls; docs/training.md,
// "Bounded replay in training"):
//
//  * the gradient of the whole tiny model under replay — a prompt whose first rows are cut at the
//    decoder start, a decoded reply, a short prompt that only sets a floor — against central
//    differences in double (tiny_model.h's directional checks: gradcheck.h's step and tolerance);
//  * the training forward against the SERVING forward in default mode on the same calls (the
//    fixture's checkpoint loaded by the serving Model, the prompt served call by call with
//    forward()'s decoder_from), within the bound the exact-mode parity argues, and closer to it than
//    the exact-mode training forward on the same rows;
//  * with no served calls, the bits of exact mode: one call of the whole sequence with decoder_from
//    0 (the plan's floors all 0, nothing cut) gives the same losses, logits and gradients, bit for
//    bit, as no calls;
//  * the sampler: a function of (seed, sequence), the turns' calls covering the sequence as
//    engine/session.cpp's default mode plans a prompt;
//  * DSpark under replay: its tensors' gradient against central differences with the drafter's
//    context what the decoder ran (features of its rows, windows above the floor at each anchor),
//    and its anchors drawn among the blocks inside a decoded reply.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../error_of.h"
#include "../fixture.h"
#include "forward/forward.h"
#include "forward/model.h"
#include "forward/sequence_state.h"
#include "gradcheck.h"
#include "tiny_model.h"
#include "train/model/parameters.h"
#include "train/model/train_model.h"

namespace dsv41 {
namespace {

using train::Parameters;
using train::ServedCall;
using train::TrainModel;

bool is_indexer(const std::string& name) { return name.find(".attn.indexer.") != std::string::npos; }

// 40 rows of tiny (W = 16, decoder from layer 4): a prompt of 30 served in default mode (rows 0–13
// cut, the decoder on 14–29, its floor 14), a reply of 4 decoded, a prompt of 6 (≤ W: nothing cut,
// the floor moves to 34).
const std::vector<ServedCall> kTinyCalls = {{30, 14}, {4, 0, true}, {6, 34}};

TEST(TrainReplay, GradientsMatchCentralDifferencesTiny) {
  const Config c = test::tiny(true);
  Parameters<double> p = test::make_parameters<double>(c);
  TrainModel<double> model(p);
  const test::Sequence s = test::make_sequence(c, 40, 13);
  Trace first;
  model.forward(s.tokens, s.engram_ids.data(), &first, {}, kTinyCalls);
  // The decoder ran 16 + 4 + 6 rows; the encoder all 40.
  EXPECT_EQ(model.logits().size(), size_t(26 * c.vocab_size));
  EXPECT_EQ(first.route_experts[0].size(), size_t(40 * c.n_activated_experts));
  EXPECT_EQ(first.route_experts[size_t(c.decoder_start())].size(), size_t(26 * c.n_activated_experts));
  Trace held = test::hold(first);
  auto losses = [&] { return model.forward(s.tokens, s.engram_ids.data(), &held, {}, kTinyCalls); };
  losses();
  const train::Margins m = model.margins();
  EXPECT_GT(m.engram_dot, 1e-3) << "an Engram gate near its signed root's floor";
  EXPECT_GT(m.indexer_dot, 1e-4) << "an indexer dot near relu's kink";
  EXPECT_LT(m.expert_preactivation, c.swiglu_limit - 1) << "an expert near its clamp";
  EXPECT_LT(m.gate_logit, 19) << "a gate logit near softplus's threshold";

  p.zero_grad();
  model.backward();
  std::vector<std::vector<train::Param<double>*>> groups;
  for (train::Param<double>& t : p.all()) {
    if (test::max_abs(t.grad) == 0) continue;  // the gates' biases, DSpark's stage, experts no row chose
    test::add_to_groups(groups, t);
  }
  const double worst = test::check_directions(groups, [&](const std::string& name) {
    const train::Losses l = losses();
    return is_indexer(name) ? l.indexer : l.lm;
  });
  std::printf("%zu directional checks under bounded replay, the worst at %.1f%% of its tolerance\n", groups.size(), 100 * worst);
  EXPECT_GT(groups.size(), size_t(150));
}

// One call of the whole sequence with decoder_from 0 is exact mode: the same bits as no calls.
TEST(TrainReplay, OneExactCallIsExactModeBitForBit) {
  const Config c = test::tiny(true);
  Parameters<double> init = test::make_parameters<double>(c);
  Parameters<float> a(c), b(c);
  a.copy_values(init);
  b.copy_values(init);
  const test::Sequence s = test::make_sequence(c, 48, 21);
  TrainModel<float> ma(a), mb(b);
  const std::vector<ServedCall> whole = {{48, 0}};
  const train::Losses la = ma.forward(s.tokens, s.engram_ids.data());
  const train::Losses lb = mb.forward(s.tokens, s.engram_ids.data(), nullptr, {}, whole);
  EXPECT_EQ(la.lm, lb.lm);
  EXPECT_EQ(la.indexer, lb.indexer);
  EXPECT_EQ(ma.logits(), mb.logits());
  a.zero_grad();
  b.zero_grad();
  ma.backward();
  mb.backward();
  for (const train::Param<float>& t : a.all())
    EXPECT_EQ(std::memcmp(t.grad.data(), b.at(t.name).grad.data(), t.grad.size() * sizeof(float)), 0) << t.name;
}

TEST(TrainReplay, CallsAreSampledAsServingPlansPrompts) {
  const Config c = test::tiny(true);
  const int64_t W = c.window_size;
  for (uint64_t sequence = 0; sequence < 20; ++sequence) {
    const std::vector<ServedCall> calls = train::replay_calls(c, 256, 4, 7, sequence);
    EXPECT_EQ(calls, train::replay_calls(c, 256, 4, 7, sequence)) << "a function of (seed, sequence)";
    int64_t at = 0, prompts = 0;
    bool after_prompt = false;
    for (size_t i = 0; i < calls.size(); ++i) {
      const ServedCall& k = calls[i];
      ASSERT_GE(k.rows, 1);
      // A reply follows its prompt, decoded (decoder_from 0); a prompt has default mode's
      // decoder_from, its end minus min(W, rows) (at a position > 0, never 0).
      const bool reply = after_prompt && k.decoder_from == 0;
      if (!reply) {
        EXPECT_EQ(k.decoder_from, at + k.rows - std::min(W, k.rows)) << sequence << ", call " << i;
        ++prompts;
      }
      after_prompt = !reply;
      at += k.rows;
    }
    EXPECT_EQ(at, 256);
    EXPECT_EQ(prompts, 4) << sequence;
  }
  EXPECT_NE(train::replay_calls(c, 256, 4, 7, 0), train::replay_calls(c, 256, 4, 7, 1));
  EXPECT_NE(train::replay_calls(c, 256, 4, 7, 0), train::replay_calls(c, 256, 4, 8, 0));
  // More turns than rows: one a row.
  EXPECT_EQ(train::replay_calls(c, 3, 10, 1, 0).size(), 3u);
}

TEST(TrainReplay, RefusesBadCalls) {
  const Config c = test::tiny(true);
  Parameters<float> p(c);
  train::init_parameters(p, {});
  TrainModel<float> m(p);
  const test::Sequence s = test::make_sequence(c, 8, 1);
  const std::vector<ServedCall> short_calls = {{5, 0}}, long_calls = {{5, 0}, {4, 0}}, empty_call = {{0, 0}, {8, 0}};
  EXPECT_NE(test::error_of([&] { m.forward(s.tokens, s.engram_ids.data(), nullptr, {}, short_calls); }).find("covering the 8 rows"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { m.forward(s.tokens, s.engram_ids.data(), nullptr, {}, long_calls); }).find("covering the 8 rows"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { m.forward(s.tokens, s.engram_ids.data(), nullptr, {}, empty_call); }).find("at least 1 row"),
            std::string::npos);
  const std::vector<ServedCall> decoded_prompt = {{8, 2, true}};
  EXPECT_NE(test::error_of([&] { m.forward(s.tokens, s.engram_ids.data(), nullptr, {}, decoded_prompt); }).find("a decoded call with decoder_from 0"),
            std::string::npos);
}

// 50 rows of tiny (W = 16, γ = 4): a prompt of 30 (rows 0–13 cut, floor 14), a reply of 6, a prompt
// of 6 (nothing cut, the floor moves to 36), a reply of 8. Draftable blocks lie in a reply: anchors
// 30–32 and 42–46.
const std::vector<ServedCall> kDraftCalls = {{30, 14}, {6, 0, true}, {6, 36}, {8, 0, true}};

TEST(TrainReplay, DSparkAnchorsAreDrawnInsideTheReplies) {
  const Config c = test::tiny(true);
  ASSERT_EQ(c.dspark_block_size, 4);
  EXPECT_EQ(train::dspark_anchors(c, 50, 100, 1, 0, kDraftCalls), (std::vector<int64_t>{30, 31, 32, 42, 43, 44, 45, 46}));
  const std::vector<int64_t> some = train::dspark_anchors(c, 50, 3, 1, 0, kDraftCalls);
  ASSERT_EQ(some.size(), 3u);
  for (int64_t a : some) EXPECT_TRUE((a >= 30 && a <= 32) || (a >= 42 && a <= 46)) << a;
  EXPECT_EQ(train::dspark_anchors(c, 50, 3, 1, 0, kDraftCalls), some) << "a function of (seed, sequence, calls)";
  // The sampled turns: every anchor's block inside one decoded call.
  for (uint64_t sequence = 0; sequence < 10; ++sequence) {
    const std::vector<ServedCall> calls = train::replay_calls(c, 256, 4, 7, sequence);
    for (int64_t a : train::dspark_anchors(c, 256, 16, 7, sequence, calls)) {
      int64_t at = 0;
      bool inside = false;
      for (const ServedCall& k : calls) {
        inside |= k.decoded && a >= at && a + c.dspark_block_size <= at + k.rows;
        at += k.rows;
      }
      EXPECT_TRUE(inside) << "sequence " << sequence << ", anchor " << a;
    }
  }
  // No reply long enough for a block: no anchor.
  EXPECT_TRUE(train::dspark_anchors(c, 40, 16, 1, 0, std::vector<ServedCall>{{30, 14}, {3, 0, true}, {7, 33}}).empty());
  EXPECT_NE(test::error_of([&] { train::dspark_anchors(c, 40, 16, 1, 0, kDraftCalls); }).find("covering the 40 rows"), std::string::npos);
}

// A block on rows the decoder cut is refused by name (the target ran no logits there).
TEST(TrainReplay, DSparkBlocksOnCutRowsRefused) {
  const Config c = test::tiny(true);
  Parameters<float> p(c);
  train::init_parameters(p, {});
  TrainModel<float> m(p);
  const test::Sequence s = test::make_sequence(c, 50, 1);
  const std::vector<int64_t> anchors = {10};
  EXPECT_NE(test::error_of([&] { m.forward(s.tokens, s.engram_ids.data(), nullptr, anchors, kDraftCalls); }).find("rows the decoder ran"),
            std::string::npos);
}

// DSpark's tensors under replay against central differences of L_dspark in double (choices and
// labels held): anchors 30 (its window 14–29, the first prompt's decoder rows: the cut rows 0–13
// never listed), 42 and 46 (windows from 26 and 30, the slots below the floor 36 empty).
TEST(TrainReplay, DSparkGradientsMatchCentralDifferencesTiny) {
  const Config c = test::tiny(true);
  Parameters<double> p = test::make_parameters<double>(c);
  TrainModel<double> model(p);
  const test::Sequence s = test::make_sequence(c, 50, 17);
  const std::vector<int64_t> anchors = {30, 42, 46};
  Trace first;
  model.forward(s.tokens, s.engram_ids.data(), &first, anchors, kDraftCalls);
  ASSERT_EQ(first.route_experts.size(), size_t(c.n_total_layers()));
  Trace held = test::hold(first);
  model.hold_dspark_labels(true);
  auto losses = [&] { return model.forward(s.tokens, s.engram_ids.data(), &held, anchors, kDraftCalls); };
  const train::Losses l0 = losses();
  EXPECT_GT(l0.dspark, 0);
  const train::Margins m = model.margins();
  EXPECT_LT(m.expert_preactivation, c.swiglu_limit - 1) << "an expert near its clamp";
  EXPECT_LT(m.gate_logit, 19) << "a gate logit near softplus's threshold";

  p.zero_grad();
  model.backward(0, 0, 1);
  std::vector<std::vector<train::Param<double>*>> groups;
  for (train::Param<double>& t : p.all()) {
    const double scale = test::max_abs(t.grad);
    if (!t.name.starts_with("mtp.")) {
      EXPECT_EQ(scale, 0.0) << t.name << ": DSpark's loss reached the backbone";
      continue;
    }
    if (scale == 0) continue;  // the stage's gate bias, experts no row chose
    test::add_to_groups(groups, t);
  }
  const double worst = test::check_directions(groups, [&](const std::string&) { return losses().dspark; });
  std::printf("%zu directional checks of DSpark's tensors under bounded replay, the worst at %.1f%% of its tolerance\n", groups.size(),
              100 * worst);
  EXPECT_GE(groups.size(), size_t(25));
}

// The serving forward in default mode, the prompt served as `calls`: every decoder row's logits, and
// its choices gathered as the training forward's rows hold them (the encoder's layers over all rows,
// the decoder's over the rows it ran, in position order).
struct Served {
  std::vector<float> logits;
  std::vector<int64_t> rows;  // the positions with logits
  Trace choices;              // topk and route_experts, as one trace of the whole sequence
};

Served serve(const Model& model, const std::vector<int64_t>& prompt, const int64_t* ids, const std::vector<ServedCall>& calls) {
  const Config& c = model.config();
  const int64_t per_row = c.has_engram() ? int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns() : 0;
  SequenceState state(c);
  Served out;
  out.choices.route_experts.assign(size_t(c.n_layers), {});
  int64_t at = 0;
  for (const ServedCall& call : calls) {
    Trace t;
    ForwardOptions options;
    options.all_logits = true;
    options.trace = &t;
    options.decoder_from = call.decoder_from;
    const std::vector<int> tokens(prompt.begin() + at, prompt.begin() + at + call.rows);
    const std::vector<float> z = forward(model, state, tokens, ids ? ids + at * per_row : nullptr, options);
    out.logits.insert(out.logits.end(), z.begin(), z.end());
    const int64_t first = std::max(at, call.decoder_from);
    for (int64_t r = first; r < at + call.rows; ++r) out.rows.push_back(r);
    for (const auto& [l, rows] : t.topk) out.choices.topk[l].insert(out.choices.topk[l].end(), rows.begin(), rows.end());
    for (int l = 0; l < c.n_layers; ++l)
      out.choices.route_experts[size_t(l)].insert(out.choices.route_experts[size_t(l)].end(), t.route_experts[size_t(l)].begin(),
                                                  t.route_experts[size_t(l)].end());
    at += call.rows;
  }
  EXPECT_EQ(out.logits.size(), out.rows.size() * size_t(c.vocab_size));
  return out;
}

// ‖a − b‖ / ‖b‖.
double relative(const std::vector<float>& a, const std::vector<float>& b) {
  double d2 = 0, n2 = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d2 += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n2 += double(b[i]) * b[i];
  }
  return std::sqrt(d2 / n2);
}

// The bf16 fixture's 300-token prompt served as five calls: a long prompt (84 rows cut), a reply, a
// short prompt (a floor, nothing cut), a reply, a long prompt (124 rows cut) — 92 decoder rows.
//
// The bound is the exact-mode parity's (train_model_parity_test.cpp): what separates the training
// forward from the serving one is the bf16 rounding points training drops, about 300 on a row's path,
// √300 · 2⁻⁸/√3 ≈ 4% RMS of the logits; bounded replay adds no arithmetic of its own (it drops rows
// and lists fewer window slots), so the same 4%. The exact-mode training forward on the same rows
// (its windows not truncated) must be farther from the served logits than the replay one: the
// truncation, the one approximation of bounded replay (docs/forward.md), is what the switch
// simulates. Measured: 1.7% under replay, 14% in exact mode; with the cut but the floors ignored,
// 5.9% (fails).
TEST(TrainReplay, MatchesTheServingForwardInDefaultMode) {
  std::unique_ptr<Model> model = Model::load(test::fixture_dir("v41-tiny-bf16"));
  const Config& c = model->config();
  test::Expected ex("v41-tiny-bf16");
  const std::vector<int64_t> prompt = ex.ints("prompt2.tokens");
  ASSERT_EQ(prompt.size(), 300u);
  const std::vector<int64_t> hashes = c.has_engram() ? ex.ints("prompt2.prefill.engram_hash") : std::vector<int64_t>{};
  const int64_t* ids = hashes.empty() ? nullptr : hashes.data();
  ASSERT_EQ(c.window_size, 16);
  const std::vector<ServedCall> calls = {{100, 84}, {20, 0}, {10, 120}, {30, 0}, {140, 284}};
  const Served served = serve(*model, prompt, ids, calls);
  ASSERT_EQ(served.rows.size(), 92u);

  train::Parameters<float> params(c);
  train::load_parameters(params, *model);
  train::TrainOptions qat;
  qat.kv_fp4 = qat.swa_fp8 = qat.mxfp4_indexer = true;
  std::vector<int64_t> sequence = prompt;
  sequence.push_back(ex.ints("prompt2.decode.tokens").at(0));

  // Bounded replay in training, the served choices imposed.
  train::TrainModel<float> replay(params, qat);
  Trace held = test::hold(served.choices);
  const train::Losses losses = replay.forward(sequence, ids, &held, {}, calls);
  const std::vector<float> ours = replay.logits();
  ASSERT_EQ(ours.size(), served.logits.size());
  const int64_t V = c.vocab_size;
  const double rel = relative(ours, served.logits);

  // The training loss is the mean over the decoder's rows of their next token's cross-entropy.
  double own = 0;
  for (size_t i = 0; i < served.rows.size(); ++i) {
    const float* z = ours.data() + int64_t(i) * V;
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(z[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - mx);
    own += mx + std::log(sum) - z[sequence[size_t(served.rows[i] + 1)]];
  }
  own /= double(served.rows.size());
  EXPECT_NEAR(losses.lm, own, 1e-5 * own);

  // Exact mode in training on the same rows: the choices of an exact-mode serving of the prompt.
  const Served exact = serve(*model, prompt, ids, {{300, 0}});
  train::TrainModel<float> plain(params, qat);
  Trace exact_held = test::hold(exact.choices);
  plain.forward(sequence, ids, &exact_held);
  const std::vector<float> all = plain.logits();
  std::vector<float> same_rows;
  for (int64_t r : served.rows) same_rows.insert(same_rows.end(), all.begin() + r * V, all.begin() + (r + 1) * V);
  const double rel_exact = relative(same_rows, served.logits);
  std::printf("bounded replay in training: logits %.2f%% RMS off the serving forward in default mode (bound 4%%); "
              "exact-mode training on the same rows %.2f%%\n", 100 * rel, 100 * rel_exact);
  EXPECT_LE(rel, 0.04);
  // Measured 1.7% against 14%: the truncation moves these rows' logits by several times the bound.
  EXPECT_GT(rel_exact, 2 * 0.04);
}

}  // namespace
}  // namespace dsv41
