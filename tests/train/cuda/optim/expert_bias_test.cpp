// The expert loads and the bias update on the device (train_cuda/optim/expert_bias.h) against
// src/train/optim/expert_bias.h: the same counts and the same bias bits (integers, and one fp32
// add per expert of ±rate or 0, the same on both). The loads of 4096 rows × top-6 of 384 experts
// skewed toward the low ids, with ids outside the table counted apart (the CPU refuses them); the
// bias update on those loads and on constructed ones with experts exactly at the mean (left alone);
// the CUDA trainer's update from loads counted on the host, layer after layer, step after step.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "optim_device.h"
#include "train/cuda/optim/expert_bias.h"
#include "train/optim/expert_bias.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(CudaOptimExpertBias, LoadsAndBiasAreTheCpus) {
  DSV41_REQUIRE_DEVICE();
  const int64_t rows = 4096, n_experts = 384;
  const int topk = 6;
  std::mt19937 rng(11);
  std::geometric_distribution<int32_t> skewed(0.01);
  std::vector<int32_t> experts(size_t(rows * topk));
  for (int32_t& e : experts) e = skewed(rng) % int32_t(n_experts);
  const std::vector<int64_t> want = optim::expert_loads(experts.data(), rows, topk, n_experts);

  DeviceArray<int32_t> d_experts(experts);
  DeviceArray<int64_t> d_loads(size_t(n_experts + 1));
  d_loads.poison();
  train_cuda::optim::expert_loads(d_experts.get(), rows, topk, n_experts, d_loads.get());
  std::vector<int64_t> got = d_loads.download();
  EXPECT_EQ(got.back(), 0) << "ids outside the table";
  got.pop_back();
  EXPECT_EQ(got, want);

  std::vector<float> bias = test::normal(size_t(n_experts), 0.01, 12);
  DeviceArray<float> d_bias(bias);
  for (int step = 0; step < 3; ++step) {
    optim::update_expert_bias(bias.data(), want.data(), n_experts, optim::kExpertBiasRate);
    train_cuda::optim::update_expert_bias(d_bias.get(), d_loads.get(), n_experts, optim::kExpertBiasRate);
  }
  EXPECT_TRUE(test::same_bits(d_bias.download(), bias));

  // Ids outside [0, n_experts): counted in the last slot, not in any expert's.
  experts[0] = -1;
  experts[1] = int32_t(n_experts);
  experts[2] = 1 << 30;
  d_experts.upload(experts);
  train_cuda::optim::expert_loads(d_experts.get(), rows, topk, n_experts, d_loads.get());
  got = d_loads.download();
  EXPECT_EQ(got.back(), 3);
  int64_t total = 0;
  for (int64_t e = 0; e < n_experts; ++e) total += got[size_t(e)];
  EXPECT_EQ(total, rows * topk - 3);
}

// Loads 4, 2, 3, 3 (mean 3): the first falls, the second rises, the two at the mean keep their
// bias exactly; one expert alone is always at its mean.
TEST(CudaOptimExpertBias, AnExpertAtTheMeanKeepsItsBias) {
  DSV41_REQUIRE_DEVICE();
  for (const std::vector<int64_t>& loads : {std::vector<int64_t>{4, 2, 3, 3}, std::vector<int64_t>{7}}) {
    const int64_t n = int64_t(loads.size());
    std::vector<float> bias = test::normal(size_t(n), 0.5, 13);
    const std::vector<float> before = bias;
    DeviceArray<float> d_bias(bias);
    DeviceArray<int64_t> d_loads(loads);
    optim::update_expert_bias(bias.data(), loads.data(), n, 0.25f);
    train_cuda::optim::update_expert_bias(d_bias.get(), d_loads.get(), n, 0.25f);
    EXPECT_TRUE(test::same_bits(d_bias.download(), bias));
    if (n == 4) {
      EXPECT_LT(bias[0], before[0]);
      EXPECT_GT(bias[1], before[1]);
      EXPECT_EQ(bias[2], before[2]);
    } else {
      EXPECT_EQ(bias[0], before[0]);
    }
  }
}

// The CUDA trainer's update (its step executor's): each layer's loads counted on the host, copied
// through the page-locked ring, the update on the device; four layers of 384, 64, 7 and 1 experts
// (one with every load at the mean) over three steps, the host's loads rewritten after each call
// and nothing waited for in between: the CPU's bias bits.
TEST(CudaOptimExpertBias, HostLoadsMoveTheBiasesAsTheCpusUpdate) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<int64_t> experts = {384, 64, 7, 1};
  std::vector<std::vector<float>> biases;
  std::vector<std::unique_ptr<DeviceArray<float>>> d_biases;
  for (size_t l = 0; l < experts.size(); ++l) {
    biases.push_back(test::normal(size_t(experts[l]), 0.01, uint32_t(20 + l)));
    d_biases.push_back(std::make_unique<DeviceArray<float>>(biases.back()));
  }
  train_cuda::PinnedUploads uploads;
  std::mt19937 rng(21);
  std::vector<int64_t> loads;
  for (int step = 0; step < 3; ++step)
    for (size_t l = 0; l < experts.size(); ++l) {
      loads.assign(size_t(experts[l]), 6);
      if (l != 1)
        for (int64_t& c : loads) c = int64_t(rng() % 200);
      optim::update_expert_bias(biases[l].data(), loads.data(), experts[l], optim::kExpertBiasRate);
      train_cuda::optim::update_expert_bias_by_host_loads(d_biases[l]->get(), loads, optim::kExpertBiasRate, uploads);
      std::fill(loads.begin(), loads.end(), -1);
    }
  for (size_t l = 0; l < experts.size(); ++l)
    EXPECT_TRUE(test::same_bits(d_biases[l]->download(), biases[l])) << experts[l] << " experts";
}

}  // namespace
}  // namespace dsv41
