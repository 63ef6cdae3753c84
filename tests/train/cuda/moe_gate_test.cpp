// train_cuda's MoE gate (scores, top-k, weights; the gradient to the logits) against
// src/train/grad/moe_gate.h in float: V4.1's 384 experts top-6 (sqrt-softplus, route scale 1.5,
// one logit past softplus's threshold of 20), the sigmoid unnormalized, a held (forced) choice,
// top-1.
//
// The CPU op includes the gate's product; with x = I (dim = rows) its logits are exactly Wᵀ (products
// by 0 and 1, sums of zeros) and its dW is exactly dlogitsᵀ, so the device kernels are fed those
// logits and compared with the CPU's scores, choice, weights and dlogits.
//
// Tolerances: the same operations in the same order, except the last bits of expf and log1pf
// (CUDA's within 2 units of 2⁻²⁴, the C library's within 1): each score within a few units of 2⁻²⁴
// relative, the weights and dlogits (ratios and differences of a few such) within ~10 (NMSE ≤
// 4e-13). Bound NMSE 1e-11; a wrong term is ≥ 1e-6. The choice: the same experts in the same order,
// the data asserted to keep the k-th and (k+1)-th biased scores of every row 1e-5 apart (the scores
// differ by ~1e-6 at most). Two runs: the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "model/gate.h"
#include "train/cuda/moe_gate.h"
#include "train/grad/moe_gate.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaMoeGate, MatchesTheCpuGate) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, experts;
    GateOptions opt;
    bool forced;
  };
  const Case cases[] = {
      {33, 384, GateOptions{6, "sqrtsoftplus", 1.0f, true, 1.5f}, false},
      {7, 8, GateOptions{2, "sigmoid", 0.7f, false, 2.5f}, false},
      {5, 16, GateOptions{3, "sqrtsoftplus", 2.0f, true, 1.0f}, true},
      {3, 4, GateOptions{1, "sqrtsoftplus", 1.0f, true, 1.0f}, false},
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const int k = c.opt.topk;
    const train_cuda::GateParams p{k, c.opt.score_func == "sigmoid", c.opt.norm_topk_prob && k > 1, c.opt.gate_temp,
                                   c.opt.route_scale};
    std::vector<float> W = test::normal(size_t(c.experts * c.rows), 2.0, seed++);
    W[0] = 25.0f;  // row 0's logit of expert 0: past softplus's threshold
    const std::vector<float> bias = test::normal(size_t(c.experts), 0.1, seed++);
    const std::vector<float> dweights = test::normal(size_t(c.rows * k), 1.0, seed++);
    std::vector<float> identity(size_t(c.rows * c.rows), 0.0f);
    for (int64_t r = 0; r < c.rows; ++r) identity[size_t(r * c.rows + r)] = 1.0f;
    std::vector<int32_t> forced;
    if (c.forced) {
      std::mt19937 rng(seed++);
      std::vector<int32_t> all(size_t(c.experts));
      std::iota(all.begin(), all.end(), 0);
      for (int64_t r = 0; r < c.rows; ++r) {
        std::shuffle(all.begin(), all.end(), rng);
        forced.insert(forced.end(), all.begin(), all.begin() + k);
      }
    }

    grad::GateSaved<float> saved;
    std::vector<int32_t> want_experts(size_t(c.rows * k));
    std::vector<float> want_weights(want_experts.size()), dx(identity.size(), 0.0f), dW(W.size(), 0.0f);
    grad::gate_forward<float>(identity.data(), c.rows, c.rows, W.data(), c.experts, bias.data(), c.opt, want_experts.data(),
                              want_weights.data(), saved, c.forced ? forced.data() : nullptr);
    grad::gate_backward<float>(identity.data(), c.rows, c.rows, W.data(), c.experts, c.opt, saved, dweights.data(), dx.data(),
                               dW.data());
    std::vector<float> want_dlogits(saved.logits.size());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t e = 0; e < c.experts; ++e) want_dlogits[size_t(r * c.experts + e)] = dW[size_t(e * c.rows + r)];
    if (!c.forced && k < c.experts)
      for (int64_t r = 0; r < c.rows; ++r) {
        std::vector<float> biased(size_t(c.experts));
        for (int64_t e = 0; e < c.experts; ++e) biased[size_t(e)] = saved.scores[size_t(r * c.experts + e)] + bias[size_t(e)];
        std::sort(biased.begin(), biased.end(), std::greater<float>());
        ASSERT_GT(biased[size_t(k - 1)] - biased[size_t(k)], 1e-5f) << "row " << r << ": a near-tie at the choice's edge";
      }

    DeviceArray<float> logits(saved.logits), dbias(bias), ddw(dweights);
    DeviceArray<int32_t> dforced(c.forced ? forced : std::vector<int32_t>(1, 0));
    auto run = [&](std::vector<float>& scores, std::vector<int32_t>& experts, std::vector<float>& weights,
                   std::vector<float>& dlogits) {
      const size_t n = saved.logits.size(), nk = size_t(c.rows * k);
      DeviceArray<float> s(n), w(nk), dl(n);
      DeviceArray<int32_t> ex(nk);
      s.poison(), w.poison(), dl.poison();
      train_cuda::gate_forward(logits.get(), c.rows, c.experts, dbias.get(), p, c.forced ? dforced.get() : nullptr, s.get(),
                               ex.get(), w.get());
      train_cuda::gate_backward(logits.get(), s.get(), c.rows, c.experts, ex.get(), ddw.get(), p, dl.get());
      scores = s.download(), experts = ex.download(), weights = w.download(), dlogits = dl.download();
    };
    std::vector<float> scores, weights, dlogits;
    std::vector<int32_t> experts;
    run(scores, experts, weights, dlogits);
    const double es = test::nmse(scores, saved.scores), ew = test::nmse(weights, want_weights);
    const double ed = test::nmse(dlogits, want_dlogits);
    std::printf("gate %ld rows x %ld experts top-%d %s: NMSE scores %.3g weights %.3g dlogits %.3g\n", long(c.rows),
                long(c.experts), k, c.opt.score_func.c_str(), es, ew, ed);
    EXPECT_EQ(experts, want_experts);
    EXPECT_LT(es, 1e-11);
    EXPECT_LT(ew, 1e-11);
    EXPECT_LT(ed, 1e-11);
    std::vector<float> scores2, weights2, dlogits2;
    std::vector<int32_t> experts2;
    run(scores2, experts2, weights2, dlogits2);
    EXPECT_TRUE(test::same_bits(scores, scores2) && experts == experts2 && test::same_bits(weights, weights2) &&
                test::same_bits(dlogits, dlogits2))
        << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
