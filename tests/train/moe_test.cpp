// src/train/grad/moe.h: the MoE layer (gate, routed experts on their rows, shared expert) against
// central differences: the input, the gate, every routed expert's and the shared expert's weights;
// an expert no row chose gets no gradient; the choice stays what it was.
#include <gtest/gtest.h>

#include <vector>

#include "gradcheck.h"
#include "train/grad/moe.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

TEST(GradMoe, LayerGradientsMatchCentralDifferences) {
  const int64_t rows = 5, dim = 4, inter = 3, E = 4;
  GateOptions opt;
  opt.topk = 2;
  opt.route_scale = 1.5f;
  std::vector<double> x = normal_values(size_t(rows * dim), 1.0, 1), gate = normal_values(size_t(E * dim), 1.0, 2);
  // Expert 3's bias keeps every row away from it: it must get no gradient.
  const std::vector<double> bias = {0.1, -0.2, 0.0, -10.0};
  std::vector<std::vector<double>> weights;  // per expert, then the shared one: w1, w2, w3
  for (int64_t e = 0; e <= E; ++e)
    for (int m = 0; m < 3; ++m) weights.push_back(normal_values(size_t(inter * dim), 0.6, uint32_t(10 + 3 * e + m)));
  auto view = [&](std::vector<std::vector<double>>& ws, std::vector<double>& g) {
    grad::MoeWeights<double> w{g.data(), bias.data(), {}, {}};
    for (int64_t e = 0; e < E; ++e) w.experts.push_back({ws[size_t(3 * e)].data(), ws[size_t(3 * e + 1)].data(), ws[size_t(3 * e + 2)].data()});
    w.shared = {ws[size_t(3 * E)].data(), ws[size_t(3 * E + 1)].data(), ws[size_t(3 * E + 2)].data()};
    return w;
  };
  const std::vector<double> c = normal_values(size_t(rows * dim), 1.0, 3);
  std::vector<double> y(c.size());
  grad::MoeSaved<double> saved;
  const double limit = 10.0;  // V4.1's: these activations (of order 1) never reach it
  auto loss = [&] {
    grad::moe_forward(x.data(), rows, dim, inter, view(weights, gate), opt, limit, y.data(), saved);
    return weighted_sum(c, y);
  };
  loss();
  const std::vector<int32_t> chosen = saved.experts;
  ASSERT_TRUE(saved.rows_of[3].empty());
  std::vector<std::vector<double>> dweights;
  for (const auto& w : weights) dweights.emplace_back(w.size(), 0.0);
  std::vector<double> dx(x.size(), 0.0), dgate(gate.size(), 0.0);
  grad::moe_backward(x.data(), rows, dim, inter, view(weights, gate), opt, limit, saved, c.data(), dx.data(),
                     view(dweights, dgate));
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dgate", gate, dgate, loss);
  const char* names[3] = {"w1", "w2", "w3"};
  for (int64_t e = 0; e <= E; ++e)
    for (int m = 0; m < 3; ++m) {
      const size_t i = size_t(3 * e + m);
      const std::string name = (e == E ? std::string("shared ") : "expert " + std::to_string(e) + " ") + names[m];
      if (e == 3) {
        for (double v : dweights[i]) EXPECT_EQ(v, 0.0) << name;
        continue;
      }
      expect_gradient(name, weights[i], dweights[i], loss);
    }
  loss();
  EXPECT_EQ(saved.experts, chosen) << "the differences must not have changed the choice";
}

}  // namespace
}  // namespace dsv41
