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
// Tolerances: the device's products take bf16 operands (each cast errs by ≤ 2⁻⁹ relative, RMS
// 2⁻⁸/√3 ≈ 2.3e-3), the CPU's fp32 ones; about 40 casts lie on a path from the embedding to the
// logits (5 a sub-layer, 8 layers), so the logits would differ by ~√40 · 2.3e-3 ≈ 1.4% RMS (NMSE
// 2e-4) in a well-conditioned model, the gradients by about twice that. The H200's first run
// (2026-12-05, docs/benchmarks.md) measured more: logits NMSE 2.6e-3 – 3.3e-3, and a few tensors'
// gradients at 0.01 – 0.7 NMSE (drafter experts that see few rows, attention sinks, mHC scales:
// sums that nearly cancel, QAT codes and DSpark's TV signs that flip near their thresholds), with
// the losses within 0.3%. So each bound is set from the CPU trainer's own sensitivity to the same
// kind of rounding (rounded_cpu_run: its matrices rounded to bf16, the choices held): logits NMSE
// under max(2e-3, 16× the baseline's), each tensor's gradient under max(1e-2, 16× its baseline's)
// (the argument at rounded_cpu_run); a wrong or missing term moves a tensor far beyond what a
// rounding moves it. L_lm within 1e-2 relative; L_indexer (a KL between the attention's and the
// indexer's distributions, both moved by the products) and L_dspark within 1e-1. Two device runs:
// the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>
#include <tuple>

#include "../train_device.h"
#include "../../tiny_model.h"
#include "numerics/types.h"
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

struct DeviceRun {
  double loss = 0, indexer = 0, dspark = 0;
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> grads;
};

DeviceRun run_on_device(train::Parameters<float>& host, const train::TrainOptions& options, const test::Sequence& seq,
                        const std::vector<int64_t>& anchors, std::span<const train::ServedCall> calls, const Trace& recorded) {
  train_cuda::DeviceParameters dev(host);
  dev.upload();
  dev.zero_grad();
  train_cuda::CudaTrainModel model(host, dev, options);
  Trace held = test::hold(recorded);
  DeviceRun out;
  const train::Losses losses = model.forward(seq.tokens, seq.engram_ids.empty() ? nullptr : seq.engram_ids.data(), &held, anchors, calls);
  out.loss = losses.lm;
  out.indexer = losses.indexer;
  out.dspark = losses.dspark;
  model.backward();
  out.logits = model.logits();
  const std::vector<std::vector<float>> saved_grads = grads_of(host);
  dev.download_grads();
  size_t i = 0;
  for (train::Param<float>& p : host.all()) {
    out.grads[p.name] = p.grad;
    p.grad = saved_grads[i++];
  }
  EXPECT_EQ(held.route_experts, recorded.route_experts) << "the held experts";
  EXPECT_EQ(held.topk, recorded.topk) << "the held top-k";
  return out;
}

// The CPU trainer's own sensitivity to the roundings the device makes: the same sequences on the
// parameters with every matrix rounded to bf16 (what the device's products read), the choices
// held as recorded, each weighted by `weight` — its logits and gradients, to set against the
// unrounded run's. Where a tensor's gradient moves this much under one bf16 rounding of the
// weights, it moves as much under the device's casts; the device casts about three operands a
// product where this rounds one (x and W forward, the incoming gradient backward), so with
// independent errors its NMSE is ~3× this one's; bounds take 16× (a margin of 5), and no less
// than the absolute bounds above.
struct Baseline {
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> grads;
};
Baseline rounded_cpu_run(const Config& c, const train::TrainOptions& options, std::span<const train::TrainSequence> batch,
                         std::span<const Trace> recorded, float weight) {
  train::Parameters<float> p = test::make_parameters<float>(c);
  for (train::Param<float>& t : p.all())
    if (t.shape.size() == 2)
      for (float& v : t.value) v = round_bf16(v);
  train::TrainModel<float> cpu(p, options);
  p.zero_grad();
  Baseline out;
  for (size_t s = 0; s < batch.size(); ++s) {
    Trace held = test::hold(recorded[s]);
    cpu.forward(batch[s].tokens, batch[s].engram_ids, &held, batch[s].anchors, batch[s].calls);
    cpu.backward(weight, weight, weight);
    const std::vector<float> z = cpu.logits();
    out.logits.insert(out.logits.end(), z.begin(), z.end());
  }
  for (const train::Param<float>& t : p.all()) out.grads[t.name] = t.grad;
  return out;
}

// The device's gradients against the CPU's (host's), each within max(1e-2, 16 × the baseline's
// NMSE); the worst printed with the baseline beside them. Tensors no loss reaches: zero on both.
void expect_gradients(const train::Parameters<float>& host, const std::map<std::string, std::vector<float>>& device,
                      const Baseline& base) {
  std::vector<std::tuple<double, double, std::string>> worst;
  int reached = 0;
  for (const train::Param<float>& p : host.all()) {
    const std::vector<float>& g = device.at(p.name);
    const bool zero = std::all_of(p.grad.begin(), p.grad.end(), [](float v) { return v == 0.0f; });
    if (zero) {  // what no loss reaches (the gate's biases): zero on the device too
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; })) << p.name;
      continue;
    }
    ++reached;
    const double e = test::nmse(g, p.grad), b = test::nmse(base.grads.at(p.name), p.grad);
    worst.emplace_back(e, b, p.name);
    EXPECT_LT(e, std::max(1e-2, 16 * b)) << p.name << " (baseline " << b << ")";
  }
  EXPECT_GT(reached, 100);
  std::sort(worst.rbegin(), worst.rend());
  for (size_t i = 0; i < std::min<size_t>(10, worst.size()); ++i)
    std::printf("gradient NMSE %.3g (baseline %.3g) %s\n", std::get<0>(worst[i]), std::get<1>(worst[i]), std::get<2>(worst[i]).c_str());
}

// One sequence through both trainers; every bound as the header argues.
void expect_parity(const Config& c, const train::TrainOptions& options, int64_t rows, std::span<const train::ServedCall> calls = {}) {
  train::Parameters<float> host = test::make_parameters<float>(c);
  const test::Sequence seq = test::make_sequence(c, rows, 5);
  const std::vector<int64_t> anchors = train::dspark_anchors(c, rows, 4, 1, 0, calls);
  ASSERT_EQ(anchors.size(), 4u);

  train::TrainModel<float> cpu(host, options);
  Trace recorded;
  const int64_t* engram_ids = seq.engram_ids.empty() ? nullptr : seq.engram_ids.data();
  const train::Losses cpu_losses = cpu.forward(seq.tokens, engram_ids, &recorded, anchors, calls);
  host.zero_grad();
  cpu.backward();
  const std::vector<float> cpu_logits = cpu.logits();

  const DeviceRun got = run_on_device(host, options, seq, anchors, calls, recorded);
  ASSERT_EQ(got.logits.size(), cpu_logits.size()) << "the rows the decoder ran";
  std::printf("L_lm: CPU %.6f, device %.6f; L_indexer: CPU %.6g, device %.6g; L_dspark: CPU %.6f, device %.6f\n", cpu_losses.lm,
              got.loss, cpu_losses.indexer, got.indexer, cpu_losses.dspark, got.dspark);
  EXPECT_NEAR(got.loss, cpu_losses.lm, 1e-2 * cpu_losses.lm);
  EXPECT_NEAR(got.indexer, cpu_losses.indexer, 1e-1 * cpu_losses.indexer + 1e-6);
  ASSERT_GT(cpu_losses.dspark, 0);
  EXPECT_NEAR(got.dspark, cpu_losses.dspark, 1e-1 * cpu_losses.dspark);
  const train::TrainSequence one{seq.tokens, engram_ids, anchors, calls};
  const Baseline base = rounded_cpu_run(c, options, std::span(&one, 1), std::span(&recorded, 1), 1.0f);
  const double e_logits = test::nmse(got.logits, cpu_logits), b_logits = test::nmse(base.logits, cpu_logits);
  std::printf("logits NMSE %.3g (baseline %.3g)\n", e_logits, b_logits);
  EXPECT_LT(e_logits, std::max(2e-3, 16 * b_logits));
  expect_gradients(host, got.grads, base);

  const DeviceRun again = run_on_device(host, options, seq, anchors, calls, recorded);
  EXPECT_EQ(again.loss, got.loss);
  EXPECT_EQ(again.indexer, got.indexer);
  EXPECT_EQ(again.dspark, got.dspark);
  EXPECT_TRUE(test::same_bits(again.logits, got.logits));
  for (const auto& [name, g] : got.grads) EXPECT_TRUE(test::same_bits(again.grads.at(name), g)) << name;
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

// Three sequences in one batch on the device — one exact with draft blocks, one under bounded
// replay with its blocks inside the reply, one exact without blocks — against the CPU trainer
// running them one by one with the same weights (1/3 each): each sequence's losses, the rows'
// logits and the summed gradients, within expect_parity's bounds.
TEST(TrainCudaModel, ABatchMatchesTheCpuTrainerSequenceBySequence) {
  DSV41_REQUIRE_DEVICE();
  const Config c = test::tiny(true);
  const train::TrainOptions options{.kv_fp4 = true, .swa_fp8 = true, .mxfp4_indexer = true};
  const int64_t rows = 64;
  const std::vector<train::ServedCall> calls = {{40, 24}, {12, 0, true}, {12, 52}};
  train::Parameters<float> host = test::make_parameters<float>(c);
  std::vector<test::Sequence> seqs;
  for (uint32_t seed : {5u, 6u, 7u}) seqs.push_back(test::make_sequence(c, rows, seed));
  const std::vector<std::vector<int64_t>> anchors = {train::dspark_anchors(c, rows, 4, 1, 0), train::dspark_anchors(c, rows, 4, 1, 1, calls), {}};
  const std::vector<std::span<const train::ServedCall>> served = {{}, calls, {}};
  std::vector<train::TrainSequence> batch;
  for (size_t s = 0; s < seqs.size(); ++s) batch.push_back({seqs[s].tokens, seqs[s].engram_ids.data(), anchors[s], served[s]});

  const float w = 1.0f / 3.0f;
  train::TrainModel<float> cpu(host, options);
  host.zero_grad();
  std::vector<Trace> traces(seqs.size());
  std::vector<train::Losses> cpu_losses;
  std::vector<float> cpu_logits;
  for (size_t s = 0; s < seqs.size(); ++s) {
    cpu_losses.push_back(cpu.forward(seqs[s].tokens, seqs[s].engram_ids.data(), &traces[s], anchors[s], served[s]));
    cpu.backward(w, w, w);
    const std::vector<float> z = cpu.logits();
    cpu_logits.insert(cpu_logits.end(), z.begin(), z.end());
  }
  const Trace recorded = concatenated(traces);

  train_cuda::DeviceParameters dev(host);
  dev.upload();
  dev.zero_grad();
  train_cuda::CudaTrainModel model(host, dev, options);
  Trace held = test::hold(recorded);
  const std::vector<train::Losses> got = model.forward(batch, &held);
  model.backward(w, w, w);
  ASSERT_EQ(got.size(), seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    std::printf("sequence %zu: L_lm CPU %.6f device %.6f; L_indexer %.6g / %.6g; L_dspark %.6f / %.6f\n", s, cpu_losses[s].lm,
                got[s].lm, cpu_losses[s].indexer, got[s].indexer, cpu_losses[s].dspark, got[s].dspark);
    EXPECT_NEAR(got[s].lm, cpu_losses[s].lm, 1e-2 * cpu_losses[s].lm) << s;
    EXPECT_NEAR(got[s].indexer, cpu_losses[s].indexer, 1e-1 * cpu_losses[s].indexer + 1e-6) << s;
    EXPECT_NEAR(got[s].dspark, cpu_losses[s].dspark, 1e-1 * cpu_losses[s].dspark) << s;
  }
  EXPECT_EQ(got[2].dspark, 0.0) << "no blocks, no DSpark loss";
  EXPECT_EQ(held.route_experts, recorded.route_experts) << "the held experts";
  EXPECT_EQ(held.topk, recorded.topk) << "the held top-k";
  const std::vector<float> logits = model.logits();
  ASSERT_EQ(logits.size(), cpu_logits.size()) << "every sequence's rows the decoder ran";
  const Baseline base = rounded_cpu_run(c, options, batch, traces, w);
  const double e_logits = test::nmse(logits, cpu_logits), b_logits = test::nmse(base.logits, cpu_logits);
  std::printf("batch logits NMSE %.3g (baseline %.3g)\n", e_logits, b_logits);
  EXPECT_LT(e_logits, std::max(2e-3, 16 * b_logits));

  const std::vector<std::vector<float>> cpu_grads = grads_of(host);
  dev.download_grads();
  std::map<std::string, std::vector<float>> device;
  size_t i = 0;
  for (train::Param<float>& p : host.all()) {
    device[p.name] = p.grad;
    p.grad = cpu_grads[i++];
  }
  expect_gradients(host, device, base);
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
