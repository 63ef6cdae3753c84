// src/train/grad/indexer.h: the indexer's scores and its distillation loss, backward against
// central differences through the indexer's own weights (wq_b, weights_proj, wk, k_norm) with RoPE
// on q and k; the target built from attention probabilities; the scores' forward against the CPU op
// (backend/cpu/indexer.h index_scores).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/indexer.h"
#include "backend/cpu/rope.h"
#include "gradcheck.h"
#include "train/grad/indexer.h"
#include "train/grad/linear.h"
#include "train/grad/rms_norm.h"
#include "train/grad/rope.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;

TEST(GradIndexer, DistillationGradientsMatchCentralDifferences) {
  const int64_t rows = 3, dim = 5, q_rank = 4, heads = 2, d = 6, rope_dim = 4, hd = 5, n = 4, k = 3;
  const RopeTable rope(int(rope_dim), 40000.0, 0, 1.0, 32, 1);
  const std::vector<int64_t> positions = {2, 3, 7}, key_positions = {0, 2, 4, 6};
  const std::vector<int64_t> idx = {0, -1, 1, /* row 1 */ 0, 1, 2, /* row 2 */ 3, 1, 0};
  std::vector<double> qr = normal_values(size_t(rows * q_rank), 1.0, 1), x = normal_values(size_t(rows * dim), 1.0, 2);
  std::vector<double> latent = normal_values(size_t(n * hd), 1.0, 3);
  std::vector<double> wq_b = normal_values(size_t(heads * d * q_rank), 0.6, 4), wproj = normal_values(size_t(heads * dim), 0.6, 5);
  std::vector<double> wk = normal_values(size_t(d * hd), 0.6, 6), k_norm = normal_values(size_t(d), 1.0, 7);
  // A target on the simplex of each row's chosen entries (0 on the empty slot).
  std::vector<double> target = test::uniform_values(size_t(rows * k), 0.1, 1.0, 8);
  target[1] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0;
    for (int64_t j = 0; j < k; ++j) s += target[size_t(r * k + j)];
    for (int64_t j = 0; j < k; ++j) target[size_t(r * k + j)] /= s;
  }
  const double weight_scale = 1 / std::sqrt(double(d * heads));
  std::vector<double> q(size_t(rows * heads * d)), w(size_t(rows * heads)), kraw(size_t(n * d)), keys(kraw.size()),
      scores(size_t(rows * k));
  grad::RmsNormSaved<double> norm_saved;
  auto forward = [&] {
    grad::linear_forward(qr.data(), rows, q_rank, wq_b.data(), heads * d, q.data());
    grad::rope_forward(q.data(), rows, heads, d, rope_dim, positions.data(), rope.frequencies().data(), false);
    grad::linear_forward(x.data(), rows, dim, wproj.data(), heads, w.data());
    for (double& v : w) v *= weight_scale;
    grad::linear_forward(latent.data(), n, hd, wk.data(), d, kraw.data());
    grad::rms_norm_forward(kraw.data(), n, d, k_norm.data(), 1e-20, keys.data(), norm_saved);
    grad::rope_forward(keys.data(), n, 1, d, rope_dim, key_positions.data(), rope.frequencies().data(), false);
    grad::indexer_scores_forward(q.data(), w.data(), keys.data(), idx.data(), rows, heads, d, k, scores.data());
  };
  auto loss = [&] {
    forward();
    return grad::index_distillation_loss<double>(scores.data(), target.data(), rows, k, nullptr);
  };
  forward();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = idx[size_t(r * k + j)];
      if (t < 0) continue;
      for (int64_t h = 0; h < heads; ++h) {
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q[size_t((r * heads + h) * d + c)] * keys[size_t(t * d + c)];
        ASSERT_GT(std::fabs(dot), 1e-3) << "a dot product on relu's kink";
      }
    }
  std::vector<double> dscores(scores.size(), 0.0);
  grad::index_distillation_loss(scores.data(), target.data(), rows, k, dscores.data());
  std::vector<double> dq(q.size(), 0.0), dw(w.size(), 0.0), dkeys(keys.size(), 0.0);
  grad::indexer_scores_backward(q.data(), w.data(), keys.data(), idx.data(), rows, heads, d, k, dscores.data(), dq.data(),
                                dw.data(), dkeys.data());
  grad::rope_backward(dq.data(), rows, heads, d, rope_dim, positions.data(), rope.frequencies().data(), false);
  grad::rope_backward(dkeys.data(), n, 1, d, rope_dim, key_positions.data(), rope.frequencies().data(), false);
  for (double& v : dw) v *= weight_scale;
  std::vector<double> dwq_b(wq_b.size(), 0.0), dwproj(wproj.size(), 0.0), dwk(wk.size(), 0.0), dk_norm(k_norm.size(), 0.0),
      dkraw(kraw.size(), 0.0);
  grad::linear_backward<double>(qr.data(), rows, q_rank, wq_b.data(), heads * d, dq.data(), nullptr, dwq_b.data());
  grad::linear_backward<double>(x.data(), rows, dim, wproj.data(), heads, dw.data(), nullptr, dwproj.data());
  grad::rms_norm_backward(kraw.data(), n, d, k_norm.data(), norm_saved, dkeys.data(), dkraw.data(), dk_norm.data());
  grad::linear_backward<double>(latent.data(), n, hd, wk.data(), d, dkraw.data(), nullptr, dwk.data());
  expect_gradient("dwq_b", wq_b, dwq_b, loss);
  expect_gradient("dweights_proj", wproj, dwproj, loss);
  expect_gradient("dwk", wk, dwk, loss);
  expect_gradient("dk_norm", k_norm, dk_norm, loss);
}

// The target sums each compressed slot's probability over the heads and normalizes; the window's
// slots (before `first`) are not the indexer's. With equal scores on the k' non-empty slots the loss
// is log k' − H(p*) = Σ p* log p* + log k' and its gradient 1/k' − p*; with scores log p* it is 0.
TEST(GradIndexer, TargetAndLossByHand) {
  // One row, two heads, entries: 2 window slots then 3 compressed slots (the last empty).
  const std::vector<double> p = {0.5, 0.1, 0.2, 0.2, 0.0, /* head 1 */ 0.3, 0.3, 0.1, 0.3, 0.0};
  std::vector<double> target(3);
  grad::attention_target(p.data(), 1, 2, 5, 2, 3, target.data());
  EXPECT_NEAR(target[0], 0.3 / 0.8, 1e-15);
  EXPECT_NEAR(target[1], 0.5 / 0.8, 1e-15);
  EXPECT_EQ(target[2], 0.0);
  const std::vector<double> equal = {1.5, 1.5, -INFINITY};
  const double expect = target[0] * std::log(target[0]) + target[1] * std::log(target[1]) + std::log(2.0);
  std::vector<double> ds(3, 0.0);
  EXPECT_NEAR(grad::index_distillation_loss(equal.data(), target.data(), 1, 3, ds.data()), expect, 1e-15);
  EXPECT_NEAR(ds[0], 0.5 - target[0], 1e-15);
  EXPECT_EQ(ds[2], 0.0);
  const std::vector<double> matched = {std::log(target[0]), std::log(target[1]), -INFINITY};
  EXPECT_NEAR(grad::index_distillation_loss<double>(matched.data(), target.data(), 1, 3, nullptr), 0.0, 1e-15);
}

// The CPU op rounds q·k (fp32, within d fp32 units of Σ|q k|) to bf16, each head's relu(·) w to
// bf16 and the sum over heads (fp32, heads units) to bf16: within Σ_h |w_h| (δdot_h + ½ ulp) +
// ½ ulp of each term + heads units of Σ|terms| + ½ ulp of the score (relu is 1-Lipschitz).
TEST(GradIndexer, ScoresForwardMatchTheCpuOp) {
  const int heads = 8, d = 64;
  const int64_t n = 20;
  const std::vector<float> qf = test::bf16_normal(size_t(heads * d), 1.0, 11), kf = test::bf16_normal(size_t(n * d), 1.0, 12);
  const std::vector<float> wf = test::bf16_normal(size_t(heads), 0.1, 13);
  std::vector<float> s_cpu(static_cast<size_t>(n));
  index_scores(qf.data(), wf.data(), heads, d, kf.data(), n, s_cpu.data());
  const std::vector<double> q(qf.begin(), qf.end()), keys(kf.begin(), kf.end()), w(wf.begin(), wf.end());
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) idx[size_t(t)] = t;
  std::vector<double> s(static_cast<size_t>(n));
  grad::indexer_scores_forward(q.data(), w.data(), keys.data(), idx.data(), 1, heads, d, n, s.data());
  for (int64_t t = 0; t < n; ++t) {
    double bound = 0, terms = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0, mag = 0;
      for (int c = 0; c < d; ++c) {
        dot += q[size_t(h * d + c)] * keys[size_t(t * d + c)];
        mag += std::fabs(q[size_t(h * d + c)] * keys[size_t(t * d + c)]);
      }
      const double ddot = d * test::kF32Unit * mag + 0.5 * test::bf16_ulp(std::fabs(dot) + d * test::kF32Unit * mag);
      const double term = std::max(dot, 0.0) * std::fabs(w[size_t(h)]);
      bound += std::fabs(w[size_t(h)]) * ddot + 0.5 * test::bf16_ulp(term + std::fabs(w[size_t(h)]) * ddot);
      terms += term;
    }
    bound += heads * test::kF32Unit * terms;
    EXPECT_NEAR(s_cpu[size_t(t)], s[size_t(t)], bound + 0.5 * test::bf16_ulp(std::fabs(s[size_t(t)]) + bound)) << t;
  }
}

}  // namespace
}  // namespace dsv41
