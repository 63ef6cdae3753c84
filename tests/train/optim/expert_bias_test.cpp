// The aux-loss-free bias update (expert_bias.h): its direction on constructed loads, and the
// routing it balances when it runs against the training gate (train/grad/moe_gate.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "train/grad/moe_gate.h"
#include "train/optim/expert_bias.h"
#include "optim_test_util.h"

namespace dsv41::optim {
namespace {

TEST(ExpertBias, OverloadedFallsUnderloadedRisesAtTheMeanStays) {
  const float u = kExpertBiasRate;
  // Loads {10, 2, 4, 4}: mean 5. Expert 0 is overloaded, the others under.
  std::vector<float> bias = {0.5f, -0.25f, 0.0f, 1.0f};
  const int64_t loads[4] = {10, 2, 4, 4};
  update_expert_bias(bias.data(), loads, 4, u);
  EXPECT_EQ(bias, (std::vector<float>{0.5f - u, -0.25f + u, u, 1.0f + u}));
  // Loads {6, 4, 5, 5}: mean 5, so experts 2 and 3 keep their bias.
  const int64_t near[4] = {6, 4, 5, 5};
  std::vector<float> b2(4, 0.0f);
  update_expert_bias(b2.data(), near, 4, u);
  EXPECT_EQ(b2, (std::vector<float>{-u, u, 0.0f, 0.0f}));
}

TEST(ExpertBias, LoadsCountEveryChoiceOfEveryToken) {
  // 3 tokens × top-2.
  const int32_t chosen[6] = {0, 2, 2, 1, 2, 0};
  EXPECT_EQ(expert_loads(chosen, 3, 2, 4), (std::vector<int64_t>{2, 1, 3, 0}));
  const int32_t bad[2] = {0, 4};
  EXPECT_THROW(expert_loads(bad, 1, 2, 4), Error);
}

// 512 tokens through a gate (sqrt-softplus, top-2 of 8) whose weights favour experts 0 and 1
// for every token: at bias 0 they take 3.7 times the mean load (measured; asserted: over twice).
// 300 updates at u = 1e-3 (each bias moves by at most 0.3) against the same tokens bring the
// largest load within 10% of the mean (measured: 2.3%); the gate's weights are never touched.
TEST(ExpertBias, UpdatesBalanceASkewedGate) {
  const int64_t rows = 512, dim = 16, experts = 8;
  const std::vector<float> xf = test::gaussian(size_t(rows * dim), 1.0, 51);
  std::vector<float> Wf = test::gaussian(size_t(experts * dim), 0.05, 52);
  // Every token has a component 0.5 along (1, …, 1), which experts 0 and 1 weigh by 0.1 each.
  std::vector<double> x(xf.begin(), xf.end()), W(Wf.begin(), Wf.end()), weights(size_t(rows * 2));
  for (double& v : x) v += 0.5;
  for (int64_t e = 0; e < 2; ++e)
    for (int64_t k = 0; k < dim; ++k) W[size_t(e * dim + k)] += 0.1;
  GateOptions opt;
  opt.topk = 2;
  std::vector<float> bias(size_t(experts), 0.0f);
  std::vector<double> bias_d(bias.size());
  std::vector<int32_t> chosen(size_t(rows * 2));
  grad::GateSaved<double> saved;
  auto route = [&] {
    std::copy(bias.begin(), bias.end(), bias_d.begin());
    grad::gate_forward(x.data(), rows, dim, W.data(), experts, bias_d.data(), opt, chosen.data(), weights.data(), saved);
    return expert_loads(chosen.data(), rows, 2, experts);
  };
  const double mean = double(rows * 2) / double(experts);
  std::vector<int64_t> loads = route();
  EXPECT_GT(double(*std::max_element(loads.begin(), loads.end())), 2 * mean);
  for (int step = 0; step < 300; ++step) {
    update_expert_bias(bias.data(), loads.data(), experts, kExpertBiasRate);
    loads = route();
  }
  EXPECT_LT(double(*std::max_element(loads.begin(), loads.end())), 1.1 * mean);
}

}  // namespace
}  // namespace dsv41::optim
