// DSpark trained by `dsv41 train` (docs/training.md, "DSpark") on the `tiny` preset and the small
// corpus (small_corpus.h):
//
//  * the drafter's training forward equals the serving CPU drafter (forward/dspark.h dspark_draft)
//    on a checkpoint the trainer wrote, within the bound argued below, in exact mode and under
//    decoder bounded replay (the serving forward in default mode);
//  * DSpark's loss falls, the backbone is the same bits whether DSpark trains or not (its loss
//    reaches no backbone weight), and the trained drafter's greedy acceptance against the trained
//    target on validation text is above that of the run's initial drafter (the margin measured over
//    several seeds, below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "forward/dspark.h"
#include "forward/forward.h"
#include "forward/model.h"
#include "forward/sequence_state.h"
#include "model/engram_compress.h"
#include "model/engram_hash.h"
#include "model/tokenizer/tokenizer.h"
#include "train/data/packed_tokens.h"
#include "train/model/parameters.h"
#include "train/model/train_model.h"
#include "train/trainer/trainer.h"
#include "trainer_runs.h"

namespace dsv41::train {
namespace {

// How far `ours` is from `served`, as an RMS relative to the served values.
double relative(const std::vector<float>& ours, const std::vector<float>& served) {
  double diff2 = 0, norm2 = 0;
  for (size_t i = 0; i < served.size(); ++i) {
    diff2 += (double(ours[i]) - served[i]) * (double(ours[i]) - served[i]);
    norm2 += double(served[i]) * served[i];
  }
  return std::sqrt(diff2 / norm2);
}

// The served model of a checkpoint and the Engram hashes of any token prefix, as a prompt is hashed.
struct Served {
  std::unique_ptr<Model> model;
  std::unique_ptr<EngramHasher> hasher;
  int64_t ids = 0;  // the tokenizer's: what the engine samples from (the rows above are padding)

  explicit Served(const std::string& dir) : model(Model::load(dir)) {
    const Tokenizer tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
    ids = int64_t(tokenizer.vocab_size());
    if (model->config().has_engram())
      hasher = std::make_unique<EngramHasher>(model->config(), engram_compress_vocabulary(tokenizer).token_map);
  }
  // Greedy over the tokenizer's ids, as the engine chooses (sampling_vocab).
  int argmax(std::span<const float> logits) const { return draft_argmax(logits.first(size_t(ids))); }
  DraftChoice choice() const {
    return [this](std::span<const float> logits) { return argmax(logits); };
  }
  std::vector<int64_t> hashes(const std::vector<int>& tokens) const {
    if (!hasher) return {};
    std::vector<int64_t> ids(tokens.size() * size_t(hasher->n_layers() * hasher->columns()));
    EngramHistory history;
    hasher->hash(tokens, {}, history, ids.data());
    return ids;
  }
  // Runs `tokens` from position 0 into a new state; returns the last row's logits and the context
  // features of every row.
  std::vector<float> prefill(SequenceState& state, const std::vector<int>& tokens, std::vector<float>& hidden) const {
    const std::vector<int64_t> ids = hashes(tokens);
    ForwardOptions options;
    options.dspark_hidden = &hidden;
    return forward(*model, state, tokens, ids.empty() ? nullptr : ids.data(), options);
  }
};

std::vector<int> validation_text(size_t n) {
  const PackedTokens validation = PackedTokens::read((corpus() / "validation.tokens").string());
  return std::vector<int>(validation.tokens().begin(), validation.tokens().begin() + int64_t(n));
}

// The mean number of drafts accepted by greedy verification after each context tokens[0 .. a) of
// validation text, a = 6, 9, …, 60: the target's greedy token for position a is the anchor, DSpark
// drafts γ tokens greedily, and draft k is accepted while it and the earlier ones are the target's
// greedy continuation (components.md §6.3, T = 0).
double greedy_acceptance(const std::string& dir) {
  const Served s(dir);
  const Config& c = s.model->config();
  const std::vector<int> text = validation_text(64);
  int64_t accepted = 0, contexts = 0;
  for (size_t a = 6; a <= 60; a += 3) {
    std::vector<int> tokens(text.begin(), text.begin() + int64_t(a));
    SequenceState state(c);
    std::vector<float> hidden;
    std::vector<float> logits = s.prefill(state, tokens, hidden);
    dspark_ingest(*s.model, state, 0, hidden, int64_t(a));
    const int anchor = s.argmax(logits);
    const Draft draft = dspark_draft(*s.model, state, anchor, s.choice());
    int next = anchor, k = 0;
    for (; k < c.dspark_block_size; ++k) {
      tokens.push_back(next);
      const std::vector<int64_t> ids = s.hashes(tokens);
      const int64_t row = int64_t(ids.size() / tokens.size());
      const std::vector<int> one = {next};
      logits = forward(*s.model, state, one, ids.empty() ? nullptr : ids.data() + (int64_t(tokens.size()) - 1) * row);
      next = s.argmax(logits);
      if (draft.tokens[size_t(k) + 1] != next) break;
    }
    accepted += k;
    ++contexts;
  }
  return double(accepted) / double(contexts);
}

// DSpark's loss of `masters` on the first eight 32-token sequences of validation text, each with the
// blocks a train sequence of its index draws (Engram hashed as `s` hashes).
double validation_dspark_loss(const Parameters<float>& masters, const Served& s, uint64_t seed) {
  const Config& c = masters.config();
  Parameters<float> params(c);
  params.copy_values(masters);
  TrainModel<float> model(params);
  const std::vector<int> text = validation_text(8 * 32 + 1);
  double sum = 0;
  for (int64_t k = 0; k < 8; ++k) {
    const std::vector<int64_t> tokens(text.begin() + k * 32, text.begin() + k * 32 + 33);
    const std::vector<int64_t> ids = s.hashes(std::vector<int>(tokens.begin(), tokens.end() - 1));
    sum += model.forward(tokens, ids.empty() ? nullptr : ids.data(), nullptr, dspark_anchors(c, 32, 16, seed, uint64_t(k))).dspark;
  }
  return sum / 8;
}

// The drafter's training forward against dspark_draft on the checkpoint of a short run of `model`:
// the masters loaded from the checkpoint, the caches' codecs on (QAT), the target's choices imposed
// from the served forward (the stage's experts cannot be: dspark_draft records none). The training
// sequence is the served one up to the anchor, then the served drafts, so that each row's Markov head
// reads the token the served drafter chose. What differs is what training drops, as the backbone's
// parity test argues (tests/train/train_model_parity_test.cpp: independent roundings through a
// network that does not amplify a relative error): the draft's path is the target's up to its last
// target layer (seven of eight layers, ~175 bf16 rounding points), the context features' rounding,
// main_proj and main_norm, the stage (~25) and the head — about 205 points, √205 · 2⁻⁸/√3 ≈ 3.2% RMS
// of the logits for a bf16 checkpoint (bound 4%, the backbone's); an fp8 checkpoint adds the
// activations' e4m3 quantization in front of its products, which the backbone's test bounds at 35%
// over a longer path.
void drafter_parity(const json& model, double bound) {
  test::TempDir out("dspark_parity");
  json config = base_config(out.path(), 4);
  config["model"] = model;
  config["init_std"] = 0.05;  // a drafter whose logits are far from uniform, for the comparison to see
  Trainer::start(config_of(config))->run();
  const std::string dir = (out / "latest").string();
  const Served s(dir);
  const Config& c = s.model->config();
  const int64_t G = c.dspark_block_size, V = c.vocab_size;

  const int64_t a = 20;
  const std::vector<int> text = validation_text(size_t(a + 1));
  SequenceState state(c);
  std::vector<float> hidden;
  s.prefill(state, std::vector<int>(text.begin(), text.begin() + a), hidden);
  dspark_ingest(*s.model, state, 0, hidden, a);
  const Draft draft = dspark_draft(*s.model, state, text[size_t(a)], s.choice());

  std::vector<int> sequence(text.begin(), text.end());
  sequence.insert(sequence.end(), draft.tokens.begin() + 1, draft.tokens.end());
  ASSERT_EQ(int64_t(sequence.size()), a + G + 1);
  const std::vector<int> inputs(sequence.begin(), sequence.end() - 1);
  const std::vector<int64_t> ids = s.hashes(inputs);
  SequenceState full(c);
  Trace cpu;
  ForwardOptions options;
  options.trace = &cpu;
  forward(*s.model, full, inputs, ids.empty() ? nullptr : ids.data(), options);

  Parameters<float> params(c);
  load_parameters(params, *s.model);
  TrainOptions qat;
  qat.kv_fp4 = qat.swa_fp8 = qat.mxfp4_indexer = true;
  TrainModel<float> training(params, qat);
  Trace held;
  held.forced_topk = &cpu.topk;
  held.forced_experts = &cpu.route_experts;
  const std::vector<int64_t> tokens(sequence.begin(), sequence.end()), anchors = {a};
  training.forward(tokens, ids.empty() ? nullptr : ids.data(), &held, anchors);
  const std::vector<float> z = training.draft_logits(), conf = training.draft_confidence();
  ASSERT_EQ(z.size(), size_t(G * V));
  ASSERT_EQ(draft.logits.size(), z.size());
  const double logits_off = relative(z, draft.logits), confidence_off = relative(conf, draft.confidence);
  std::printf("%s: served draft logits %.2f%%, confidence logits %.2f%% RMS off the training drafter's (bound %.0f%%)\n",
              c.dtype.c_str(), 100 * logits_off, 100 * confidence_off, 100 * bound);
  EXPECT_LE(logits_off, bound);
  EXPECT_LE(confidence_off, bound);
  // Not the same numbers by construction: a wrong anchor's context (one position off) is far.
  const std::vector<int64_t> shifted = {a - 1};
  training.forward(tokens, ids.empty() ? nullptr : ids.data(), &held, shifted);
  EXPECT_GT(relative(training.draft_logits(), draft.logits), 2 * logits_off);
}


TEST(DSparkTrainer, TheTrainingDrafterIsTheServedOneBf16) {
  drafter_parity({{"preset", "tiny"}, {"dtype", "bf16"}, {"expert_dtype", nullptr}}, 0.04);
}
TEST(DSparkTrainer, TheTrainingDrafterIsTheServedOneFp8) { drafter_parity("tiny", 0.35); }

// Under decoder bounded replay: the text served as default mode serves a conversation — a prompt of
// 30 (rows 0–13 cut at the decoder start, the decoder window floor 14), a reply of 4 decoded token by
// token, a prompt of 6 (nothing cut, the floor 34) — each call's context features of the rows the
// decoder ran ingested after it (engine/session.cpp ran()), then the draft after the second prompt's
// last row (anchor 40: its window 24–39, the slots below the floor empty) and its γ drafts decoded.
// The training forward over the same calls (the reply of the drafts decoded), the served choices
// imposed. Bounded replay adds no arithmetic to the drafter's path (it drops rows and lists fewer
// slots), so the bound is the exact-mode parity's: 4% for a bf16 checkpoint. The training drafter
// over the whole context (exact mode, the floor ignored) must be farther than twice the distance.
// The stage's expert choices cannot be imposed (dspark_draft records none), and a near-tie flips one:
// measured on this checkpoint, a draft row whose third and fourth biased gate scores were 0.0013 and
// 0.0019 apart (the text from validation offsets 82 and 0) came out 25–29% off, the other rows
// 1.4–1.9%. So the text is taken from offset 41, where every draft row's margin is at least 0.01, and
// the test asserts that margin (measured: logits 1.9%, confidence 0.2%, exact mode 34%).
TEST(DSparkTrainer, TheTrainingDrafterIsTheServedOneUnderBoundedReplay) {
  test::TempDir out("dspark_replay_parity");
  json config = base_config(out.path(), 4);
  config["model"] = {{"preset", "tiny"}, {"dtype", "bf16"}, {"expert_dtype", nullptr}};
  config["init_std"] = 0.05;
  config["bounded_replay"] = {{"turns", 3}};
  Trainer::start(config_of(config))->run();
  const std::string dir = (out / "latest").string();
  const Served s(dir);
  const Config& c = s.model->config();
  const int64_t G = c.dspark_block_size, V = c.vocab_size, a = 40;
  ASSERT_EQ(c.window_size, 16);
  const std::vector<ServedCall> prompt_calls = {{30, 14}, {4, 0, true}, {6, 34}};
  std::vector<ServedCall> calls = prompt_calls;
  calls.push_back({G, 0, true});  // the drafts, decoded

  const int64_t offset = 41;
  std::vector<int> sequence = validation_text(size_t(offset + a + 1));
  sequence.erase(sequence.begin(), sequence.begin() + offset);
  const std::vector<int> context(sequence.begin(), sequence.begin() + a);
  const std::vector<int64_t> context_ids = s.hashes(context);
  const int64_t per_row = context.empty() || context_ids.empty() ? 0 : int64_t(context_ids.size() / context.size());
  SequenceState state(c);
  Trace choices;  // the served choices, as one trace of the sequence under these calls
  choices.route_experts.assign(size_t(c.n_layers), {});
  auto run = [&](const std::vector<int>& tokens, const int64_t* ids, int64_t at, int64_t rows, int64_t decoder_from) {
    Trace t;
    std::vector<float> hidden;
    ForwardOptions options;
    options.trace = &t;
    options.decoder_from = decoder_from;
    options.dspark_hidden = &hidden;
    const std::vector<int> part(tokens.begin() + at, tokens.begin() + at + rows);
    forward(*s.model, state, part, ids ? ids + at * per_row : nullptr, options);
    for (const auto& [l, r] : t.topk) choices.topk[l].insert(choices.topk[l].end(), r.begin(), r.end());
    for (int l = 0; l < c.n_layers; ++l)
      choices.route_experts[size_t(l)].insert(choices.route_experts[size_t(l)].end(), t.route_experts[size_t(l)].begin(),
                                              t.route_experts[size_t(l)].end());
    // The rows the decoder ran: the call's last ones (engine/session.cpp ran()).
    const int64_t ran = int64_t(hidden.size()) / (int64_t(c.dspark_target_layer_ids.size()) * c.dim);
    dspark_ingest(*s.model, state, at + rows - ran, hidden, ran);
  };
  // Prompts as one call each, the reply token by token.
  int64_t at = 0;
  for (const ServedCall& call : prompt_calls) {
    for (int64_t r = 0; r < call.rows; r += call.decoded ? 1 : call.rows)
      run(context, context_ids.empty() ? nullptr : context_ids.data(), at + r, call.decoded ? 1 : call.rows, call.decoder_from);
    at += call.rows;
  }
  const Draft draft = dspark_draft(*s.model, state, sequence[size_t(a)], s.choice());
  sequence.insert(sequence.end(), draft.tokens.begin() + 1, draft.tokens.end());
  ASSERT_EQ(int64_t(sequence.size()), a + G + 1);
  const std::vector<int> inputs(sequence.begin(), sequence.end() - 1);
  const std::vector<int64_t> ids = s.hashes(inputs);
  for (int64_t r = a; r < a + G; ++r) run(inputs, ids.empty() ? nullptr : ids.data(), r, 1, 0);

  Parameters<float> params(c);
  load_parameters(params, *s.model);
  TrainOptions qat;
  qat.kv_fp4 = qat.swa_fp8 = qat.mxfp4_indexer = true;
  TrainModel<float> training(params, qat);
  Trace held;
  held.forced_topk = &choices.topk;
  held.forced_experts = &choices.route_experts;
  const std::vector<int64_t> tokens(sequence.begin(), sequence.end()), anchors = {a};
  EXPECT_EQ(dspark_anchors(c, a + G, 100, 0, 0, calls), (std::vector<int64_t>{30, 40})) << "the blocks inside a reply";
  training.forward(tokens, ids.empty() ? nullptr : ids.data(), &held, anchors, calls);
  const std::vector<float> z = training.draft_logits(), conf = training.draft_confidence();
  ASSERT_EQ(z.size(), size_t(G * V));
  ASSERT_EQ(draft.logits.size(), z.size());
  const double logits_off = relative(z, draft.logits), confidence_off = relative(conf, draft.confidence);
  // Every draft row's routing in the stages clear of a tie: the k-th and (k+1)-th biased scores apart.
  for (int l = c.n_layers; l < c.n_total_layers(); ++l) {
    const size_t E = size_t(c.routed_experts(l)), k = size_t(c.activated_experts(l));
    ASSERT_EQ(held.route_scores[size_t(l)].size(), size_t(G) * E);
    for (int64_t r = 0; r < G; ++r) {
      std::vector<float> scores(held.route_scores[size_t(l)].begin() + r * int64_t(E), held.route_scores[size_t(l)].begin() + (r + 1) * int64_t(E));
      std::sort(scores.begin(), scores.end(), std::greater<float>());
      EXPECT_GE(scores[k - 1] - scores[k], 0.01) << "stage " << l << ", draft row " << r << ": a near-tie of experts";
    }
  }

  // Exact mode: every row, the whole window (its own choices, from an exact-mode serving forward).
  SequenceState full(c);
  Trace cpu;
  ForwardOptions options;
  options.trace = &cpu;
  forward(*s.model, full, inputs, ids.empty() ? nullptr : ids.data(), options);
  Trace exact_held;
  exact_held.forced_topk = &cpu.topk;
  exact_held.forced_experts = &cpu.route_experts;
  TrainModel<float> exact(params, qat);
  exact.forward(tokens, ids.empty() ? nullptr : ids.data(), &exact_held, anchors);
  const double exact_off = relative(exact.draft_logits(), draft.logits);
  std::printf("under bounded replay: served draft logits %.2f%%, confidence logits %.2f%% RMS off the training drafter's "
              "(bound 4%%); the exact-mode training drafter %.2f%%\n", 100 * logits_off, 100 * confidence_off, 100 * exact_off);
  EXPECT_LE(logits_off, 0.04);
  EXPECT_LE(confidence_off, 0.04);
  EXPECT_GT(exact_off, 2 * logits_off);
}


// Per seed, two runs of 30 steps from the same initialisation: DSpark trained (weight 1) and not
// (weight 0: the drafter stays as initialised). The backbones are the same bits (DSpark's loss
// reaches no backbone weight, and nothing else differs), so the two drafters face the same target:
// against it, on validation text, the trained drafter's DSpark loss is below the initial one's and
// its greedy acceptance above. (The training curve of DSpark's loss is no measure: its target
// sharpens as the backbone learns — at the start both distributions are near uniform, L_tv ≈ 0 and
// c* ≈ 1 — and it rose from 1.44 to 1.53–1.76 over these runs.) Measured with seeds 1 to 3: the
// validation DSpark loss 1.67, 1.78, 1.67 trained against 2.72, 2.71, 2.64 initial (falls of 0.86 to
// 1.05); drafts accepted per verification (of γ = 4) 0.84, 0.26, 0.95 trained against 0.11, 0.05,
// 0.32 initial: gains of 0.74, 0.21, 0.63. Asserted: half the smallest fall (0.4) and half the
// smallest gain (0.1).
TEST(DSparkTrainer, TrainingRaisesTheDraftersAcceptance) {
  constexpr int64_t kSteps = 30;
  double smallest_gain = INFINITY;
  for (int seed = 1; seed <= 3; ++seed) {
    test::TempDir with("dspark_with"), without("dspark_without");
    json config = base_config(with.path(), kSteps);
    config["seed"] = seed;
    config["schedule"] = {{"peak_lr", 0.02}, {"warmup_steps", 2}};
    config["validation_interval"] = 0;
    std::unique_ptr<Trainer> trained = Trainer::start(config_of(config));
    trained->run();
    config["out"] = without.string();
    config["dspark"] = {{"loss_weight", 0}};
    std::unique_ptr<Trainer> initial = Trainer::start(config_of(config));
    initial->run();

    for (const Param<float>& p : trained->parameters().all()) {
      const Param<float>& q = initial->parameters().at(p.name);
      const bool same = p.value == q.value;
      if (p.name.starts_with("mtp.")) {
        if (!p.name.ends_with("gate.bias")) {
          EXPECT_FALSE(same) << p.name << ": not trained";
        }
      } else {
        EXPECT_TRUE(same) << p.name << ": DSpark's training moved a backbone weight";
      }
    }
    std::vector<double> dspark;
    for (const json& e : log_of(with.path()))
      if (e["event"] == "train") dspark.push_back(e.at("dspark_loss").get<double>());
    for (const json& e : log_of(without.path()))
      if (e["event"] == "train") {
        EXPECT_FALSE(e.contains("dspark_loss")) << "an untrained DSpark's loss logged";
      }
    ASSERT_EQ(dspark.size(), size_t(kSteps));
    const Served s((with / "latest").string());
    const double loss_trained = validation_dspark_loss(trained->parameters(), s, uint64_t(seed)),
                 loss_initial = validation_dspark_loss(initial->parameters(), s, uint64_t(seed));
    const double acc_trained = greedy_acceptance((with / "latest").string());
    const double acc_initial = greedy_acceptance((without / "latest").string());
    std::printf("seed %d: DSpark training loss %.3f -> %.3f; on validation %.3f trained, %.3f initial; greedy acceptance %.3f trained, "
                "%.3f initial (of %d)\n",
                seed, dspark.front(), dspark.back(), loss_trained, loss_initial, acc_trained, acc_initial,
                int(trained->config().model.dspark_block_size));
    EXPECT_LT(loss_trained, loss_initial - 0.4);
    smallest_gain = std::min(smallest_gain, acc_trained - acc_initial);
  }
  EXPECT_GT(smallest_gain, 0.1);
}

}  // namespace
}  // namespace dsv41::train
