// The CUDA trainer's forward and backward (src/train/cuda/model/cuda_train_model.h) against the CPU
// trainer's TrainModel<float>, parameters away from the initial point (tiny_model.h), the CPU's
// expert and top-k choices held on the device: the tiny preset made SWA-only (48 rows: three
// windows of 16; SWA-FP8 QAT), the tiny preset without Engram (CSA2's Full, Reuse and Reindex
// layers, the candidate source, the indexer's loss; 64 rows; every QAT switch on), and the whole
// tiny preset (Engram too), exactly and under decoder bounded replay (served calls: a prompt whose
// first rows are cut at the decoder start, a decoded reply, a short prompt that moves the floor);
// each with DSpark's drafter on four draft blocks (its stage's experts held too; its loss's labels
// each trainer's own; under replay, blocks inside the reply).
//
// A batch of three sequences (one under replay, one without draft blocks) against the CPU trainer
// running them one by one.
//
// Each case runs the device twice. With fp32 products (Operands::Fp32: the CPU's arithmetic but for
// the order of the sums) every op of the device is compared with the CPU's at fp32's scale: the
// losses within 1e-4 relative, the logits within NMSE 1e-6 and each tensor's gradient within NMSE
// 1e-4. Argument: the sums differ in order only, ~√K · 2⁻²⁴ ≈ 2e-6 relative per product at the
// tiny preset's widths (K ≤ 256), compounded over ~40 ops on a path and amplified by Sinkhorn's 20
// sweeps and the softmaxes (≤ 100×: NMSE ~1e-8 for the logits); what moves more are QAT codes and
// DSpark's TV signs that flip at their thresholds under such a perturbation, each a local jump —
// hence the gradients' 1e-4. Measured on an H100 (2026-12-05, the six cases): losses within 5e-7
// relative, logits NMSE ≤ 5.9e-10, the worst tensor's gradient NMSE 1.0e-6 (the indexer's
// projections in the whole-backbone case), each two orders under its bound; a wrong or missing
// term of any op, forward or backward, moves its tensors by NMSE ≳ 1e-2.
//
// With bf16 products (what training runs: each cast errs by ≤ 2⁻⁹ relative, ~40 casts on a path)
// the H200's and an H100's runs measured losses within 0.3%, logits NMSE 2.6e-3 – 3.3e-3 and a few
// tensors' gradients at 0.1 – 3.5 NMSE (mHC's scales through Sinkhorn, drafter experts that see few
// rows, attention sinks; Engram's gate weights, whose derivative 1/(2√|dot|) flips sign with a row
// whose dot is within the casts' spread of zero): so per-tensor gradients are not a bf16 check.
// The bf16 run is held to L_lm within 1e-2 relative, L_indexer and L_dspark within 1e-1, the
// logits within NMSE 1e-2, and the whole gradient (every tensor's, concatenated) within NMSE 5e-2
// of the CPU's: what the casts do to a well-conditioned model, with a margin (measured, the same
// run: logits NMSE 2.6e-3 – 3.3e-3, whole gradient 7.5e-3 – 1.1e-2); the fp32 run is what checks
// each op. Two bf16 device runs: the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>

#include "../train_device.h"
#include "../../tiny_model.h"
#include "train/cuda/model/cuda_train_model.h"
#include "train/model/train_model.h"

namespace dsv41 {
namespace {

Config swa_only_tiny() {
  Config c = preset("tiny");
  c.engram_layer_ids.clear();
  c.engram_num_embeddings.clear();
  for (int& r : c.compress_ratios) r = 0;
  c.kv_source_layers.clear();
  c.index_source_layers.clear();
  c.candidate_source_layer = -1;
  validate(c);
  return c;
}

// Every host tensor's gradient, in host.all()'s order.
std::vector<std::vector<float>> grads_of(train::Parameters<float>& host) {
  std::vector<std::vector<float>> g;
  for (const train::Param<float>& p : host.all()) g.push_back(p.grad);
  return g;
}

// The CPU trainer's run of a batch, sequence by sequence, each weighted by `weight`, its choices
// recorded (one trace per sequence) — or the device's of the same batch as one, those choices held.
struct TrainRun {
  std::vector<train::Losses> losses;
  std::vector<float> logits;  // every sequence's, in order
  std::map<std::string, std::vector<float>> grads;
};

// The CPU's traces of several sequences as one over their rows in order (the batch's trace).
Trace concatenated(const std::vector<Trace>& traces) {
  Trace t;
  for (const Trace& one : traces) {
    if (t.route_experts.size() < one.route_experts.size()) t.route_experts.resize(one.route_experts.size());
    for (size_t l = 0; l < one.route_experts.size(); ++l)
      t.route_experts[l].insert(t.route_experts[l].end(), one.route_experts[l].begin(), one.route_experts[l].end());
    for (const auto& [l, rows] : one.topk) t.topk[l].insert(t.topk[l].end(), rows.begin(), rows.end());
  }
  return t;
}

TrainRun run_on_cpu(train::Parameters<float>& host, const train::TrainOptions& options, std::span<const train::TrainSequence> batch,
               float weight, Trace& recorded) {
  train::TrainModel<float> cpu(host, options);
  host.zero_grad();
  std::vector<Trace> traces(batch.size());
  TrainRun out;
  for (size_t s = 0; s < batch.size(); ++s) {
    out.losses.push_back(cpu.forward(batch[s].tokens, batch[s].engram_ids, &traces[s], batch[s].anchors, batch[s].calls));
    cpu.backward(weight, weight, weight);
    const std::vector<float> z = cpu.logits();
    out.logits.insert(out.logits.end(), z.begin(), z.end());
  }
  for (const train::Param<float>& p : host.all()) out.grads[p.name] = p.grad;
  recorded = concatenated(traces);
  return out;
}

TrainRun run_on_device(train::Parameters<float>& host, const train::TrainOptions& options, std::span<const train::TrainSequence> batch,
                  float weight, const Trace& recorded, train_cuda::Operands operands) {
  train_cuda::DeviceParameters dev(host);
  dev.upload();
  dev.zero_grad();
  train_cuda::CudaTrainModel model(host, dev, options, operands);
  Trace held = test::hold(recorded);
  TrainRun out;
  out.losses = model.forward(batch, &held);
  model.backward(weight, weight, weight);
  out.logits = model.logits();
  const std::vector<std::vector<float>> saved = grads_of(host);
  dev.download_grads();
  size_t i = 0;
  for (train::Param<float>& p : host.all()) {
    out.grads[p.name] = p.grad;
    p.grad = saved[i++];
  }
  EXPECT_EQ(held.route_experts, recorded.route_experts) << "the held experts";
  EXPECT_EQ(held.topk, recorded.topk) << "the held top-k";
  return out;
}

// Each sequence's losses, printed: L_lm within lm_rel relative, L_indexer within other_rel relative
// + indexer_abs, L_dspark within other_rel relative.
void expect_losses(const TrainRun& cpu, const TrainRun& dev, const char* products, double lm_rel, double other_rel,
                   double indexer_abs) {
  ASSERT_EQ(dev.losses.size(), cpu.losses.size());
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    const train::Losses &c = cpu.losses[s], &d = dev.losses[s];
    std::printf("%s products, sequence %zu: L_lm CPU %.7f device %.7f; L_indexer %.7g / %.7g; L_dspark %.7f / %.7f\n", products, s,
                c.lm, d.lm, c.indexer, d.indexer, c.dspark, d.dspark);
    EXPECT_NEAR(d.lm, c.lm, lm_rel * c.lm) << s;
    EXPECT_NEAR(d.indexer, c.indexer, other_rel * c.indexer + indexer_abs) << s;
    EXPECT_NEAR(d.dspark, c.dspark, other_rel * c.dspark) << s;
  }
}

// The fp32 device run against the CPU's: every bound of the header's first paragraph, each
// tensor's gradient on its own; the ten worst printed.
void expect_fp32_parity(const TrainRun& cpu, const TrainRun& dev) {
  expect_losses(cpu, dev, "fp32", 1e-4, 1e-4, 1e-9);
  ASSERT_EQ(dev.logits.size(), cpu.logits.size()) << "the rows the decoder ran";
  const double e_logits = test::nmse(dev.logits, cpu.logits);
  std::printf("fp32 products: logits NMSE %.3g (bound 1e-6)\n", e_logits);
  EXPECT_LT(e_logits, 1e-6);
  std::vector<std::pair<double, std::string>> worst;
  int reached = 0;
  for (const auto& [name, c] : cpu.grads) {
    const std::vector<float>& g = dev.grads.at(name);
    if (std::all_of(c.begin(), c.end(), [](float v) { return v == 0.0f; })) {  // what no loss reaches (the gate's biases)
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; })) << name;
      continue;
    }
    ++reached;
    const double e = test::nmse(g, c);
    worst.emplace_back(e, name);
    EXPECT_LT(e, 1e-4) << name;
  }
  EXPECT_GT(reached, 100);
  std::sort(worst.rbegin(), worst.rend());
  for (size_t i = 0; i < std::min<size_t>(10, worst.size()); ++i)
    std::printf("fp32 products: gradient NMSE %.3g %s\n", worst[i].first, worst[i].second.c_str());
}

// Every tensor's gradient, concatenated in name order.
std::vector<float> whole_gradient(const TrainRun& run) {
  std::vector<float> all;
  for (const auto& [name, g] : run.grads) all.insert(all.end(), g.begin(), g.end());
  return all;
}

// The bf16 device run (training's arithmetic) against the CPU's: the header's second paragraph.
void expect_bf16_parity(const TrainRun& cpu, const TrainRun& dev) {
  expect_losses(cpu, dev, "bf16", 1e-2, 1e-1, 1e-6);
  ASSERT_EQ(dev.logits.size(), cpu.logits.size()) << "the rows the decoder ran";
  const double e_logits = test::nmse(dev.logits, cpu.logits), e_grad = test::nmse(whole_gradient(dev), whole_gradient(cpu));
  std::printf("bf16 products: logits NMSE %.3g (bound 1e-2), whole gradient NMSE %.3g (bound 5e-2)\n", e_logits, e_grad);
  EXPECT_LT(e_logits, 1e-2);
  EXPECT_LT(e_grad, 5e-2);
}

// A batch through both trainers (the CPU's sequence by sequence, weighted `weight` each), the
// device with fp32 and with bf16 products, and the bf16 run twice: the same bits. Returns the bf16 run.
TrainRun expect_parity(const Config& c, const train::TrainOptions& options, std::span<const train::TrainSequence> batch, float weight) {
  train::Parameters<float> host = test::make_parameters<float>(c);
  Trace recorded;
  const TrainRun cpu = run_on_cpu(host, options, batch, weight, recorded);
  expect_fp32_parity(cpu, run_on_device(host, options, batch, weight, recorded, train_cuda::Operands::Fp32));
  const TrainRun bf16 = run_on_device(host, options, batch, weight, recorded, train_cuda::Operands::Bf16);
  expect_bf16_parity(cpu, bf16);
  const TrainRun again = run_on_device(host, options, batch, weight, recorded, train_cuda::Operands::Bf16);
  for (size_t s = 0; s < bf16.losses.size(); ++s) {
    EXPECT_EQ(again.losses[s].lm, bf16.losses[s].lm);
    EXPECT_EQ(again.losses[s].indexer, bf16.losses[s].indexer);
    EXPECT_EQ(again.losses[s].dspark, bf16.losses[s].dspark);
  }
  EXPECT_TRUE(test::same_bits(again.logits, bf16.logits));
  for (const auto& [name, g] : bf16.grads) EXPECT_TRUE(test::same_bits(again.grads.at(name), g)) << name;
  return bf16;
}

// One sequence of `rows` with four draft blocks (inside the decoded reply under served calls).
void expect_parity(const Config& c, const train::TrainOptions& options, int64_t rows, std::span<const train::ServedCall> calls = {}) {
  const test::Sequence seq = test::make_sequence(c, rows, 5);
  const std::vector<int64_t> anchors = train::dspark_anchors(c, rows, 4, 1, 0, calls);
  ASSERT_EQ(anchors.size(), 4u);
  const train::TrainSequence one{seq.tokens, seq.engram_ids.empty() ? nullptr : seq.engram_ids.data(), anchors, calls};
  const TrainRun got = expect_parity(c, options, std::span(&one, 1), 1.0f);
  ASSERT_EQ(got.losses.size(), 1u);
  EXPECT_GT(got.losses[0].dspark, 0) << "four draft blocks";
}

TEST(TrainCudaModel, SwaOnlyMatchesTheCpuTrainer) {
  DSV41_REQUIRE_DEVICE();
  expect_parity(swa_only_tiny(), train::TrainOptions{.swa_fp8 = true}, 48);
}

TEST(TrainCudaModel, Csa2MatchesTheCpuTrainer) {
  DSV41_REQUIRE_DEVICE();
  expect_parity(test::tiny(false), train::TrainOptions{.kv_fp4 = true, .swa_fp8 = true, .mxfp4_indexer = true}, 64);
}

TEST(TrainCudaModel, TheWholeBackboneMatchesTheCpuTrainer) {
  DSV41_REQUIRE_DEVICE();
  expect_parity(test::tiny(true), train::TrainOptions{.kv_fp4 = true, .swa_fp8 = true, .mxfp4_indexer = true}, 64);
}

// 64 rows of tiny (W = 16, the decoder from layer 4): a prompt of 40 served in default mode (rows
// 0–23 cut, the decoder on 24–39, its floor 24), a reply of 12 decoded (the draft blocks inside
// it), a prompt of 12 (≤ W: nothing cut, the floor moves to 52).
TEST(TrainCudaModel, BoundedReplayMatchesTheCpuTrainer) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<train::ServedCall> calls = {{40, 24}, {12, 0, true}, {12, 52}};
  expect_parity(test::tiny(true), train::TrainOptions{.kv_fp4 = true, .swa_fp8 = true, .mxfp4_indexer = true}, 64, calls);
}

// Three sequences in one batch on the device — one exact with draft blocks, one under bounded
// replay with its blocks inside the reply, one exact without blocks — against the CPU trainer
// running them one by one with the same weights (1/3 each): each sequence's losses, the rows'
// logits and the summed gradients.
TEST(TrainCudaModel, ABatchMatchesTheCpuTrainerSequenceBySequence) {
  DSV41_REQUIRE_DEVICE();
  const Config c = test::tiny(true);
  const int64_t rows = 64;
  const std::vector<train::ServedCall> calls = {{40, 24}, {12, 0, true}, {12, 52}};
  std::vector<test::Sequence> seqs;
  for (uint32_t seed : {5u, 6u, 7u}) seqs.push_back(test::make_sequence(c, rows, seed));
  const std::vector<std::vector<int64_t>> anchors = {train::dspark_anchors(c, rows, 4, 1, 0), train::dspark_anchors(c, rows, 4, 1, 1, calls), {}};
  const std::vector<std::span<const train::ServedCall>> served = {{}, calls, {}};
  std::vector<train::TrainSequence> batch;
  for (size_t s = 0; s < seqs.size(); ++s) batch.push_back({seqs[s].tokens, seqs[s].engram_ids.data(), anchors[s], served[s]});
  const TrainRun got = expect_parity(c, train::TrainOptions{.kv_fp4 = true, .swa_fp8 = true, .mxfp4_indexer = true}, batch, 1.0f / 3.0f);
  ASSERT_EQ(got.losses.size(), 3u);
  EXPECT_EQ(got.losses[2].dspark, 0.0) << "no blocks, no DSpark loss";
}

TEST(TrainCudaModel, WhatIsNotWrittenIsRefusedByName) {
  DSV41_REQUIRE_DEVICE();
  const Config c = preset("tiny");
  train::Parameters<float> host(c);
  train_cuda::DeviceParameters dev(host);
  train_cuda::CudaTrainModel model(host, dev);
  const test::Sequence seq = test::make_sequence(c, 8, 1);
  const std::vector<std::vector<float>> streams;
  Trace imposing;
  imposing.forced_streams = &streams;
  try {
    model.forward(seq.tokens, seq.engram_ids.data(), &imposing);
    ADD_FAILURE() << "imposed layer inputs were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("imposed layer inputs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model.forward(seq.tokens), Error) << "a model with Engram and no hash ids";
}

}  // namespace
}  // namespace dsv41
