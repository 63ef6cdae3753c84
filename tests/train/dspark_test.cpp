// DSpark's heads and loss (src/train/grad/dspark.h) against central differences in double
// (gradcheck.h's step and tolerance): the Markov head (the embedding's gather, then z = u + W2 e),
// the confidence head c = w · [x ; e], and the loss 0.1 L_ce + 0.9 L_tv + L_conf — each alone and
// composed, every input and parameter coordinate. The loss's labels (the signs of p − q and c*) are
// held from the first forward, as the backward holds them: the checked function is then smooth.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gradcheck.h"
#include "train/grad/dspark.h"
#include "train/grad/embedding.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

constexpr int64_t kRows = 6, kVocab = 12, kRank = 4, kDim = 5, kBlock = 3;

TEST(DSparkGrad, MarkovHead) {
  std::vector<double> u = normal_values(kRows * kVocab, 1.0, 1), W1 = normal_values(kVocab * kRank, 1.0, 2),
                      W2 = normal_values(kVocab * kRank, 1.0, 3), c = normal_values(kRows * kVocab, 1.0, 4);
  const std::vector<int64_t> prev = {3, 7, 3, 0, 11, 5};  // token 3 twice: its row gets both gradients
  auto run = [&](std::vector<double>& e, std::vector<double>& z) {
    e.assign(kRows * kRank, 0);
    z.assign(kRows * kVocab, 0);
    grad::gather_rows_forward(W1.data(), kVocab, kRank, prev.data(), kRows, e.data());
    grad::markov_forward(u.data(), kRows, kVocab, W2.data(), kRank, e.data(), z.data());
  };
  std::vector<double> e, z;
  run(e, z);
  // Known answer: z = u + W2 W1[prev] at one coordinate.
  double expect = u[2 * kVocab + 5];
  for (int64_t j = 0; j < kRank; ++j) expect += W2[5 * kRank + j] * W1[3 * kRank + j];
  EXPECT_NEAR(z[2 * kVocab + 5], expect, 1e-14);
  std::vector<double> du(u.size(), 0), de(e.size(), 0), dW1(W1.size(), 0), dW2(W2.size(), 0);
  grad::markov_backward(e.data(), kRows, kVocab, W2.data(), kRank, c.data(), du.data(), de.data(), dW2.data());
  grad::gather_rows_backward(de.data(), kRank, prev.data(), kRows, dW1.data());
  auto loss = [&] {
    std::vector<double> e2, z2;
    run(e2, z2);
    return weighted_sum(c, z2);
  };
  expect_gradient("u", u, du, loss);
  expect_gradient("W1", W1, dW1, loss);
  expect_gradient("W2", W2, dW2, loss);
}

TEST(DSparkGrad, ConfidenceHead) {
  std::vector<double> x = normal_values(kRows * kDim, 1.0, 5), e = normal_values(kRows * kRank, 1.0, 6),
                      w = normal_values(kDim + kRank, 1.0, 7), c = normal_values(kRows, 1.0, 8);
  auto run = [&] {
    std::vector<double> out(kRows);
    grad::confidence_forward(x.data(), e.data(), kRows, kDim, kRank, w.data(), out.data());
    return out;
  };
  std::vector<double> dx(x.size(), 0), de(e.size(), 0), dw(w.size(), 0);
  grad::confidence_backward(x.data(), e.data(), kRows, kDim, kRank, w.data(), c.data(), dx.data(), de.data(), dw.data());
  auto loss = [&] { return weighted_sum(c, run()); };
  expect_gradient("x", x, dx, loss);
  expect_gradient("e", e, de, loss);
  expect_gradient("w", w, dw, loss);
}

// Two blocks of 3 rows; position weights as the trainer's (exp(−k/γ) over a block, halved for two).
struct LossCase {
  std::vector<double> z = normal_values(kRows * kVocab, 1.5, 9), q, c = normal_values(kRows, 1.0, 10), rho;
  std::vector<int64_t> next = {1, 4, 4, 9, 0, 11};
  double kappa = 1.0 / kRows;
  LossCase() {
    const std::vector<double> t = normal_values(kRows * kVocab, 1.5, 11);
    q.resize(t.size());
    for (int64_t r = 0; r < kRows; ++r) {
      double s = 0;
      for (int64_t v = 0; v < kVocab; ++v) s += (q[r * kVocab + v] = std::exp(t[r * kVocab + v]));
      for (int64_t v = 0; v < kVocab; ++v) q[r * kVocab + v] /= s;
    }
    double sum = 0;
    for (int64_t k = 0; k < kBlock; ++k) sum += std::exp(-double(k) / kBlock);
    for (int64_t r = 0; r < kRows; ++r) rho.push_back(std::exp(-double(r % kBlock) / kBlock) / (2 * sum));
  }
  grad::DSparkLossParts forward(grad::DSparkLabels& labels, grad::DSparkLossSaved<double>& saved) const {
    return grad::dspark_loss_forward(z.data(), q.data(), kRows, kVocab, next.data(), c.data(), rho.data(), kappa, labels, saved);
  }
};

TEST(DSparkGrad, LossKnownAnswers) {
  LossCase k;
  grad::DSparkLabels labels;
  grad::DSparkLossSaved<double> saved;
  const grad::DSparkLossParts parts = k.forward(labels, saved);
  // Each part by its definition, from the probabilities.
  double ce = 0, tv = 0, conf = 0, accept = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    double mx = -INFINITY, s = 0, l1 = 0;
    for (int64_t v = 0; v < kVocab; ++v) mx = std::max(mx, k.z[r * kVocab + v]);
    for (int64_t v = 0; v < kVocab; ++v) s += std::exp(k.z[r * kVocab + v] - mx);
    for (int64_t v = 0; v < kVocab; ++v) l1 += std::fabs(std::exp(k.z[r * kVocab + v] - mx) / s - k.q[r * kVocab + v]);
    ce += k.rho[r] * (mx + std::log(s) - k.z[r * kVocab + k.next[r]]);
    tv += k.rho[r] * l1;
    const double target = 1 - l1 / 2, sigma = 1 / (1 + std::exp(-k.c[r]));
    EXPECT_NEAR(labels.target[r], target, 1e-15);
    conf += k.kappa * -(target * std::log(sigma) + (1 - target) * std::log(1 - sigma));
    accept += k.kappa * target;
  }
  EXPECT_NEAR(parts.ce, ce, 1e-14);
  EXPECT_NEAR(parts.tv, tv, 1e-14);
  EXPECT_NEAR(parts.conf, conf, 1e-14);
  EXPECT_NEAR(parts.accept, accept, 1e-15);
  EXPECT_NEAR(parts.total({}), 0.1 * ce + 0.9 * tv + conf, 1e-14);

  // A draft distribution equal to the target's: c* = 1, no TV; a confidence at its label's logit
  // has no gradient.
  LossCase same = k;
  for (size_t i = 0; i < same.z.size(); ++i) same.z[i] = std::log(k.q[i]);
  for (double& c : same.c) c = 30;  // σ(30) = 1 − 9e-14
  grad::DSparkLabels l2;
  grad::DSparkLossSaved<double> s2;
  const grad::DSparkLossParts p2 = same.forward(l2, s2);
  EXPECT_NEAR(p2.tv, 0, 1e-15);
  EXPECT_NEAR(p2.accept, 1, 1e-14);
  std::vector<double> dz(same.z.size(), 0), dc(kRows, 0);
  grad::dspark_loss_backward(same.c.data(), kRows, kVocab, same.next.data(), same.rho.data(), same.kappa, l2, s2, {}, 1.0, dz.data(),
                             dc.data());
  for (double g : dc) EXPECT_NEAR(g, 0, 1e-13);
}

TEST(DSparkGrad, LossGradients) {
  LossCase k;
  grad::DSparkLabels labels;
  grad::DSparkLossSaved<double> saved;
  k.forward(labels, saved);
  // No sign is near a flip: the smallest |p − q| is far above what a step of 1e-5 moves p by
  // (|∂p/∂z| ≤ ¼), so the held signs are also the signs at every difference's points.
  double margin = INFINITY;
  for (int64_t i = 0; i < kRows * kVocab; ++i) margin = std::min(margin, std::fabs(saved.p[i] - k.q[i]));
  EXPECT_GT(margin, 1e-4);
  std::vector<double> dz(k.z.size(), 0), dc(kRows, 0);
  grad::dspark_loss_backward(k.c.data(), kRows, kVocab, k.next.data(), k.rho.data(), k.kappa, labels, saved, {}, 1.0, dz.data(), dc.data());
  labels.held = true;
  auto loss = [&] {
    grad::DSparkLossSaved<double> s;
    return k.forward(labels, s).total({});
  };
  expect_gradient("z", k.z, dz, loss);
  expect_gradient("c", k.c, dc, loss);
}

// The heads and the loss composed, from the base logits, the tables, the hidden and the projection.
TEST(DSparkGrad, HeadsAndLossComposed) {
  LossCase k;
  std::vector<double> u = normal_values(kRows * kVocab, 1.0, 12), W1 = normal_values(kVocab * kRank, 0.7, 13),
                      W2 = normal_values(kVocab * kRank, 0.7, 14), x = normal_values(kRows * kDim, 1.0, 15),
                      w = normal_values(kDim + kRank, 0.5, 16);
  const std::vector<int64_t> prev = {3, 1, 4, 8, 9, 0};
  grad::DSparkLabels labels;
  struct Out {
    std::vector<double> e, z, c;
    grad::DSparkLossSaved<double> saved;
    double loss;
  };
  auto run = [&] {
    Out o{std::vector<double>(kRows * kRank), std::vector<double>(kRows * kVocab), std::vector<double>(kRows), {}, 0};
    grad::gather_rows_forward(W1.data(), kVocab, kRank, prev.data(), kRows, o.e.data());
    grad::markov_forward(u.data(), kRows, kVocab, W2.data(), kRank, o.e.data(), o.z.data());
    grad::confidence_forward(x.data(), o.e.data(), kRows, kDim, kRank, w.data(), o.c.data());
    o.loss = grad::dspark_loss_forward(o.z.data(), k.q.data(), kRows, kVocab, k.next.data(), o.c.data(), k.rho.data(), k.kappa, labels,
                                       o.saved)
                 .total({});
    return o;
  };
  Out o = run();
  std::vector<double> dz(o.z.size(), 0), dc(kRows, 0), du(u.size(), 0), de(o.e.size(), 0), dW1(W1.size(), 0), dW2(W2.size(), 0),
      dx(x.size(), 0), dw(w.size(), 0);
  grad::dspark_loss_backward(o.c.data(), kRows, kVocab, k.next.data(), k.rho.data(), k.kappa, labels, o.saved, {}, 1.0, dz.data(),
                             dc.data());
  grad::confidence_backward(x.data(), o.e.data(), kRows, kDim, kRank, w.data(), dc.data(), dx.data(), de.data(), dw.data());
  grad::markov_backward(o.e.data(), kRows, kVocab, W2.data(), kRank, dz.data(), du.data(), de.data(), dW2.data());
  grad::gather_rows_backward(de.data(), kRank, prev.data(), kRows, dW1.data());
  labels.held = true;
  auto loss = [&] { return run().loss; };
  expect_gradient("u", u, du, loss);
  expect_gradient("W1", W1, dW1, loss);
  expect_gradient("W2", W2, dW2, loss);
  expect_gradient("x", x, dx, loss);
  expect_gradient("w", w, dw, loss);
}

}  // namespace
}  // namespace dsv41
