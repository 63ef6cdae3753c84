// The CUDA trainer's forward and backward (src/train/cuda/model/cuda_train_model.h) against the CPU
// trainer's TrainModel<float> on the tiny preset made SWA-only (no compressed layers, no Engram:
// what the CUDA trainer runs so far), SWA-FP8 QAT on, 48 rows (three windows of 16), parameters
// away from the initial point (tiny_model.h), the CPU's expert choices held on the device.
//
// Tolerances: the device's products take bf16 operands (each cast errs by ≤ 2⁻⁹ relative, RMS
// 2⁻⁸/√3 ≈ 2.3e-3), the CPU's fp32 ones; about 40 casts lie on a path from the embedding to the
// logits (5 a sub-layer, 8 layers), so the logits differ by ~√40 · 2.3e-3 ≈ 1.4% RMS (NMSE 2e-4) and
// the gradients, whose paths are twice as long, by about twice that. Bounds: logits NMSE 2e-3, each
// tensor's gradient NMSE 1e-2 (10% RMS: a dropped term of a sum over 8 layers or a wrong tensor is
// ≥ 0.1), L_lm within 1e-2 relative. Provisional until measured on the GPU (the test prints the
// worst tensors); the bounds are then set from the measured values. Two device runs: the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>

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

struct DeviceRun {
  double loss = 0;
  std::vector<float> logits;
  std::map<std::string, std::vector<float>> grads;
};

DeviceRun run_on_device(train::Parameters<float>& host, const train::TrainOptions& options, const std::vector<int64_t>& tokens,
                        const Trace& recorded) {
  train_cuda::DeviceParameters dev(host);
  dev.upload();
  dev.zero_grad();
  train_cuda::CudaTrainModel model(host, dev, options);
  Trace held;
  held.forced_experts = &recorded.route_experts;
  DeviceRun out;
  out.loss = model.forward(tokens, &held).lm;
  model.backward();
  out.logits = model.logits();
  const std::vector<std::vector<float>> saved_grads = [&] {
    std::vector<std::vector<float>> g;
    for (const train::Param<float>& p : host.all()) g.push_back(p.grad);
    return g;
  }();
  dev.download_grads();
  size_t i = 0;
  for (train::Param<float>& p : host.all()) {
    out.grads[p.name] = p.grad;
    p.grad = saved_grads[i++];
  }
  EXPECT_EQ(held.route_experts, recorded.route_experts) << "the held choices";
  return out;
}

TEST(TrainCudaModel, ForwardAndBackwardMatchTheCpuTrainer) {
  DSV41_REQUIRE_DEVICE();
  const Config c = swa_only_tiny();
  train::Parameters<float> host = test::make_parameters<float>(c);
  const test::Sequence seq = test::make_sequence(c, 48, 5);
  const train::TrainOptions options{.swa_fp8 = true};

  train::TrainModel<float> cpu(host, options);
  Trace recorded;
  const double cpu_loss = cpu.forward(seq.tokens, nullptr, &recorded).lm;
  host.zero_grad();
  cpu.backward();
  const std::vector<float> cpu_logits = cpu.logits();

  const DeviceRun got = run_on_device(host, options, seq.tokens, recorded);
  std::printf("L_lm: CPU %.6f, device %.6f\n", cpu_loss, got.loss);
  EXPECT_NEAR(got.loss, cpu_loss, 1e-2 * cpu_loss);
  const double e_logits = test::nmse(got.logits, cpu_logits);
  std::printf("logits NMSE %.3g\n", e_logits);
  EXPECT_LT(e_logits, 2e-3);

  std::vector<std::pair<double, std::string>> worst;
  int reached = 0;
  for (const train::Param<float>& p : host.all()) {
    const std::vector<float>& g = got.grads.at(p.name);
    const bool zero = std::all_of(p.grad.begin(), p.grad.end(), [](float v) { return v == 0.0f; });
    if (zero) {  // what the loss does not reach (DSpark's stages, the gate's bias): zero on the device too
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; })) << p.name;
      continue;
    }
    ++reached;
    const double e = test::nmse(g, p.grad);
    worst.emplace_back(e, p.name);
    EXPECT_LT(e, 1e-2) << p.name;
  }
  EXPECT_GT(reached, 100);
  std::sort(worst.rbegin(), worst.rend());
  for (size_t i = 0; i < std::min<size_t>(8, worst.size()); ++i) std::printf("gradient NMSE %.3g %s\n", worst[i].first, worst[i].second.c_str());

  const DeviceRun again = run_on_device(host, options, seq.tokens, recorded);
  EXPECT_EQ(again.loss, got.loss);
  EXPECT_TRUE(test::same_bits(again.logits, got.logits));
  for (const auto& [name, g] : got.grads) EXPECT_TRUE(test::same_bits(again.grads.at(name), g)) << name;
}

TEST(TrainCudaModel, WhatIsNotWrittenIsRefusedByName) {
  DSV41_REQUIRE_DEVICE();
  const Config c = preset("tiny");  // CSA2 and Engram
  train::Parameters<float> host(c);
  train_cuda::DeviceParameters dev(host);
  train_cuda::CudaTrainModel model(host, dev);
  const test::Sequence seq = test::make_sequence(c, 8, 1);
  try {
    model.forward(seq.tokens);
    ADD_FAILURE() << "a model with compressed layers ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compressed layers"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dsv41
