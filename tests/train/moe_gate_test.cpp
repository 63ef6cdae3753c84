// src/train/grad/moe_gate.h: the gate's backward against central differences (input and gate
// weight) for both score functions, normalized and not, with logits across softplus's threshold;
// the bias steering the choice and nothing else; the forward against the CPU op
// (backend/cpu/moe.h route): the same experts, weights within a stated bound; imposed experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/moe.h"
#include "gradcheck.h"
#include "train/grad/moe_gate.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

// The smallest gap, over the rows, between the k-th and the (k+1)-th biased score: a choice that
// a perturbation of the data cannot change has a gap far above what the perturbation moves.
double choice_margin(const grad::GateSaved<double>& saved, const std::vector<double>& bias, int64_t rows, int64_t E, int k) {
  double margin = INFINITY;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> b(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) b[size_t(e)] = saved.scores[size_t(r * E + e)] + bias[size_t(e)];
    std::sort(b.begin(), b.end(), std::greater<>());
    if (k < E) margin = std::min(margin, b[size_t(k - 1)] - b[size_t(k)]);
  }
  return margin;
}

// max_z (optional): the largest logit / temp, for the test that wants the data past softplus's
// threshold.
void check_gate(const GateOptions& opt, uint32_t seed, double x_scale, double* max_z = nullptr) {
  const int64_t rows = 4, dim = 5, E = 6;
  const int k = opt.topk;
  std::vector<double> x = normal_values(size_t(rows * dim), x_scale, seed), W = normal_values(size_t(E * dim), 1.0, seed + 1);
  const std::vector<double> bias = normal_values(size_t(E), 0.3, seed + 2);
  const std::vector<double> c = normal_values(size_t(rows * k), 1.0, seed + 3);
  std::vector<int32_t> experts(size_t(rows * k));
  std::vector<double> w(size_t(rows * k));
  grad::GateSaved<double> saved;
  auto loss = [&] {
    grad::gate_forward(x.data(), rows, dim, W.data(), E, bias.data(), opt, experts.data(), w.data(), saved);
    return weighted_sum(c, w);
  };
  loss();
  const std::vector<int32_t> chosen = experts;
  // A step h of one value moves a logit by h times a value of x or W (at most 3e-4 here), a score
  // by less: the choice and the side of softplus's threshold stay put.
  ASSERT_GT(choice_margin(saved, bias, rows, E, k), 1e-3);
  for (double logit : saved.logits)
    ASSERT_GT(std::fabs(logit / opt.gate_temp - 20), 1e-3) << "a logit on softplus's threshold";
  std::vector<double> dx(x.size(), 0.0), dW(W.size(), 0.0);
  grad::gate_backward(x.data(), rows, dim, W.data(), E, opt, saved, c.data(), dx.data(), dW.data());
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dW", W, dW, loss);
  loss();
  EXPECT_EQ(experts, chosen) << "the differences must not have changed the choice";
  if (max_z) *max_z = *std::max_element(saved.logits.begin(), saved.logits.end()) / opt.gate_temp;
}

GateOptions options(int topk, const char* func, float temp, bool norm, float route_scale) {
  GateOptions o;
  o.topk = topk;
  o.score_func = func;
  o.gate_temp = temp;
  o.norm_topk_prob = norm;
  o.route_scale = route_scale;
  return o;
}

TEST(GradMoeGate, SqrtSoftplusNormalizedMatchesCentralDifferences) { check_gate(options(2, "sqrtsoftplus", 1.0f, true, 1.5f), 1, 1.0); }

TEST(GradMoeGate, TemperatureAndUnnormalizedMatchCentralDifferences) {
  check_gate(options(3, "sqrtsoftplus", 1.5f, false, 2.0f), 12, 1.0);
}

TEST(GradMoeGate, SigmoidScoresMatchCentralDifferences) { check_gate(options(2, "sigmoid", 1.0f, true, 1.0f), 21, 1.0); }

TEST(GradMoeGate, SingleExpertMatchesCentralDifferences) { check_gate(options(1, "sqrtsoftplus", 1.0f, true, 1.0f), 31, 1.0); }

// Inputs ten times larger put logits past softplus's threshold (20), where sqrt(softplus) is √z.
TEST(GradMoeGate, LogitsPastTheSoftplusThresholdMatchCentralDifferences) {
  double max_z = 0;
  check_gate(options(2, "sqrtsoftplus", 1.0f, true, 1.0f), 41, 10.0, &max_z);
  EXPECT_GT(max_z, 20.0);
}

// The bias decides which experts, never how much: a bias that flips the choice moves the weights
// to the other expert's unbiased score.
TEST(GradMoeGate, BiasChoosesButDoesNotWeigh) {
  const std::vector<double> x = {1.0}, W = {1.0, 2.0, 0.0};  // logits 1, 2, 0
  const GateOptions opt = options(1, "sigmoid", 1.0f, true, 1.0f);
  std::vector<int32_t> e(1);
  std::vector<double> w(1);
  grad::GateSaved<double> saved;
  const std::vector<double> none = {0, 0, 0}, push = {0, 0, 5};
  grad::gate_forward(x.data(), 1, 1, W.data(), 3, none.data(), opt, e.data(), w.data(), saved);
  EXPECT_EQ(e[0], 1);
  EXPECT_NEAR(w[0], 1 / (1 + std::exp(-2.0)), 1e-15);
  grad::gate_forward(x.data(), 1, 1, W.data(), 3, push.data(), opt, e.data(), w.data(), saved);
  EXPECT_EQ(e[0], 2);
  EXPECT_NEAR(w[0], 0.5, 1e-15);
}

// The CPU op computes the logits in fp32 (off by δz = K fp32 units of Σ|x w|), the score with
// exp, log1p and sqrt (4 fp32 units of s more), and the weights with a sum and a division. A score
// moves by |f'| δz + 4u s; a normalized weight w_j = s_j / S · rs by (δs_j / S + s_j Σδs / S²) rs,
// plus 4 units of w for the sum, division and route scale. The choice is the same where the k-th
// and (k+1)-th biased scores are further apart than twice the largest score error (asserted).
TEST(GradMoeGate, ForwardMatchesTheCpuOp) {
  const int64_t rows = 16, dim = 64, E = 12;
  const GateOptions opt = options(3, "sqrtsoftplus", 1.0f, true, 1.5f);
  const std::vector<float> xf = test::bf16_normal(size_t(rows * dim), 1.0, 51), wf = test::bf16_normal(size_t(E * dim), 0.2, 52);
  const std::vector<float> bf = test::bf16_normal(size_t(E), 0.1, 53);
  std::vector<int32_t> e_cpu(size_t(rows * opt.topk));
  std::vector<float> w_cpu(size_t(rows * opt.topk));
  route(xf.data(), rows, test::f32_view(wf, E, dim), test::f32_view(bf, 1, E), opt, e_cpu.data(), w_cpu.data());

  const std::vector<double> x(xf.begin(), xf.end()), W(wf.begin(), wf.end()), bias(bf.begin(), bf.end());
  std::vector<int32_t> e(e_cpu.size());
  std::vector<double> w(w_cpu.size());
  grad::GateSaved<double> saved;
  grad::gate_forward(x.data(), rows, dim, W.data(), E, bias.data(), opt, e.data(), w.data(), saved);
  const int k = opt.topk;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> ds(static_cast<size_t>(E));
    double max_ds = 0;
    for (int64_t j = 0; j < E; ++j) {
      double abs_sum = 0;
      for (int64_t c = 0; c < dim; ++c) abs_sum += std::fabs(x[size_t(r * dim + c)] * W[size_t(j * dim + c)]);
      const double z = saved.logits[size_t(r * E + j)], s = saved.scores[size_t(r * E + j)];
      const double fprime = 1 / (1 + std::exp(-z)) / (2 * s);
      ds[size_t(j)] = fprime * dim * test::kF32Unit * abs_sum + 4 * test::kF32Unit * s;
      max_ds = std::max(max_ds, ds[size_t(j)]);
    }
    ASSERT_GT(choice_margin(saved, bias, rows, E, k), 2 * max_ds) << "a near-tie: the CPU may choose otherwise";
    double S = 0, sum_ds = 0;
    for (int j = 0; j < k; ++j) {
      S += saved.scores[size_t(r * E + e[size_t(r * k + j)])];
      sum_ds += ds[size_t(e[size_t(r * k + j)])];
    }
    for (int j = 0; j < k; ++j) {
      const size_t i = size_t(r * k + j);
      ASSERT_EQ(e_cpu[i], e[i]) << "row " << r << " choice " << j;
      const double s = saved.scores[size_t(r * E + e[i])];
      const double bound = (ds[size_t(e[i])] / S + s * sum_ds / (S * S)) * opt.route_scale + 4 * test::kF32Unit * w[i];
      EXPECT_NEAR(w_cpu[i], w[i], bound) << "row " << r << " choice " << j;
    }
  }
}

}  // namespace
}  // namespace dsv41

namespace dsv41 {
namespace {

// Imposed experts (the trainer holds a step's choices fixed, and the parity tests impose the CPU
// forward's): taken in the given order whatever the scores, weighted by their own normalized
// scores, with the gradient reaching exactly them — against central differences, which no choice
// can disturb here.
TEST(GradMoeGate, ForcedExpertsAreTakenWeighedAndDifferentiated) {
  const int64_t rows = 3, dim = 5, E = 6;
  const GateOptions opt = options(2, "sqrtsoftplus", 1.0f, true, 1.5f);
  std::vector<double> x = test::normal_values(size_t(rows * dim), 1.0, 61), W = test::normal_values(size_t(E * dim), 1.0, 62);
  const std::vector<double> bias = test::normal_values(size_t(E), 0.3, 63), c = test::normal_values(size_t(rows * 2), 1.0, 64);
  const std::vector<int32_t> forced = {5, 0, 3, 4, 1, 2};
  std::vector<int32_t> experts(forced.size());
  std::vector<double> w(forced.size());
  grad::GateSaved<double> saved;
  auto loss = [&] {
    grad::gate_forward(x.data(), rows, dim, W.data(), E, bias.data(), opt, experts.data(), w.data(), saved, forced.data());
    return test::weighted_sum(c, w);
  };
  loss();
  EXPECT_EQ(experts, forced);
  for (int64_t r = 0; r < rows; ++r) {
    const double s0 = saved.scores[size_t(r * E + forced[size_t(2 * r)])], s1 = saved.scores[size_t(r * E + forced[size_t(2 * r + 1)])];
    EXPECT_NEAR(w[size_t(2 * r)], 1.5 * s0 / (s0 + s1), 1e-15);
    EXPECT_NEAR(w[size_t(2 * r + 1)], 1.5 * s1 / (s0 + s1), 1e-15);
  }
  std::vector<double> dx(x.size(), 0.0), dW(W.size(), 0.0);
  grad::gate_backward(x.data(), rows, dim, W.data(), E, opt, saved, c.data(), dx.data(), dW.data());
  test::expect_gradient("dx", x, dx, loss);
  test::expect_gradient("dW", W, dW, loss);
  const std::vector<int32_t> out_of_range = {6, 0, 3, 4, 1, 2};
  EXPECT_THROW(grad::gate_forward(x.data(), rows, dim, W.data(), E, bias.data(), opt, experts.data(), w.data(), saved,
                                  out_of_range.data()),
               Error);
}

}  // namespace
}  // namespace dsv41
