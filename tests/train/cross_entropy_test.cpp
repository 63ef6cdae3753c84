// src/train/grad/cross_entropy.h: the loss over the head against central differences (the final
// hidden rows and the head), a row without a target, and hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "base/error.h"
#include "gradcheck.h"
#include "train/grad/cross_entropy.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;

TEST(GradCrossEntropy, GradientsMatchCentralDifferences) {
  const int64_t rows = 4, d = 6, vocab = 9;
  const std::vector<int64_t> targets = {3, -1, 8, 3};
  std::vector<double> h = normal_values(size_t(rows * d), 1.0, 1), W = normal_values(size_t(vocab * d), 1.0, 2);
  grad::CrossEntropySaved<double> saved;
  auto loss = [&] { return grad::head_cross_entropy_forward(h.data(), rows, d, W.data(), vocab, targets.data(), saved); };
  loss();
  EXPECT_EQ(saved.counted, 3);
  std::vector<double> dh(h.size(), 0.0), dW(W.size(), 0.0);
  grad::head_cross_entropy_backward(h.data(), rows, d, W.data(), vocab, targets.data(), saved, 1.0, dh.data(), dW.data());
  expect_gradient("dh", h, dh, loss);
  expect_gradient("dW", W, dW, loss);
  for (int64_t k = 0; k < d; ++k) EXPECT_EQ(dh[size_t(d + k)], 0.0) << "row 1 has no target";
}

// Equal logits: every row's loss is log V. A head that puts logit a on the target and 0 elsewhere:
// log(e^a + V − 1) − a.
TEST(GradCrossEntropy, HandComputedLosses) {
  const int64_t vocab = 5;
  const std::vector<double> h = {1.0, 2.0}, zeros(size_t(vocab * 1), 0.0);
  const std::vector<int64_t> targets = {0, 4};
  grad::CrossEntropySaved<double> saved;
  EXPECT_NEAR(grad::head_cross_entropy_forward(h.data(), 2, 1, zeros.data(), vocab, targets.data(), saved), std::log(5.0), 1e-15);
  const std::vector<double> W = {0, 0, 0, 0, 3};  // logit 3 h on token 4
  const std::vector<int64_t> t4 = {4};
  const double a = 3.0;
  EXPECT_NEAR(grad::head_cross_entropy_forward(h.data(), 1, 1, W.data(), vocab, t4.data(), saved),
              std::log(std::exp(a) + 4) - a, 1e-15);
  const std::vector<int64_t> none = {-1};
  EXPECT_EQ(grad::head_cross_entropy_forward(h.data(), 1, 1, W.data(), vocab, none.data(), saved), 0.0);
  const std::vector<int64_t> bad = {5};
  EXPECT_THROW(grad::head_cross_entropy_forward(h.data(), 1, 1, W.data(), vocab, bad.data(), saved), Error);
}

}  // namespace
}  // namespace dsv41
