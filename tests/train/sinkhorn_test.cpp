// src/train/grad/sinkhorn.h: the backward of mHC's split and Sinkhorn normalization, through the
// unrolled iterations, against central differences (the mixes, the scales and the biases) for 1,
// 3 and V4.1's 20 iterations; the forward against the CPU's (backend/cpu/sinkhorn.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/sinkhorn.h"
#include "gradcheck.h"
#include "train/grad/sinkhorn.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;

constexpr int kHc = 4, kMix = (2 + kHc) * kHc;
constexpr double kHcEps = 1e-6;  // V4.1 hc_eps

void check_sinkhorn(int iters, uint32_t seed) {
  std::vector<double> m = normal_values(kMix, 1.0, seed), base = normal_values(kMix, 0.5, seed + 1);
  std::vector<double> scale = {0.5, 0.7, 1.0};
  const std::vector<double> c = normal_values(size_t(2 * kHc + kHc * kHc), 1.0, seed + 2);
  const double* cpre = c.data();
  const double* cpost = c.data() + kHc;
  const double* ccomb = c.data() + 2 * kHc;
  auto loss = [&] {
    double pre[kHc], post[kHc], comb[kHc * kHc];
    grad::split_sinkhorn_forward(m.data(), scale.data(), base.data(), kHc, iters, kHcEps, pre, post, comb);
    double sum = 0;
    for (int j = 0; j < kHc; ++j) sum += cpre[j] * pre[j] + cpost[j] * post[j];
    for (int k = 0; k < kHc * kHc; ++k) sum += ccomb[k] * comb[k];
    return sum;
  };
  std::vector<double> dm(m.size(), 0.0), dscale(3, 0.0), dbase(base.size(), 0.0);
  grad::split_sinkhorn_backward(m.data(), scale.data(), base.data(), kHc, iters, kHcEps, cpre, cpost, ccomb, dm.data(),
                                dscale.data(), dbase.data());
  const std::string at = " (" + std::to_string(iters) + " iterations)";
  expect_gradient("dm" + at, m, dm, loss);
  expect_gradient("dscale" + at, scale, dscale, loss);
  expect_gradient("dbase" + at, base, dbase, loss);
}

TEST(GradSinkhorn, OneIterationMatchesCentralDifferences) { check_sinkhorn(1, 1); }
TEST(GradSinkhorn, ThreeIterationsMatchCentralDifferences) { check_sinkhorn(3, 11); }
TEST(GradSinkhorn, TwentyIterationsMatchCentralDifferences) { check_sinkhorn(20, 21); }

// Adding one constant to every comb logit of a row changes nothing (the row softmax does not see
// it), so the gradients of a row's comb biases sum to zero, up to the rounding of the sum.
TEST(GradSinkhorn, RowShiftOfTheCombLogitsHasNoGradient) {
  const std::vector<double> m = normal_values(kMix, 1.0, 31), base = normal_values(kMix, 0.5, 32);
  const std::vector<double> scale = {0.5, 0.7, 1.0};
  const std::vector<double> dcomb = normal_values(kHc * kHc, 1.0, 33), zeros(kHc, 0.0);
  std::vector<double> dm(kMix, 0.0), dscale(3, 0.0), dbase(kMix, 0.0);
  grad::split_sinkhorn_backward(m.data(), scale.data(), base.data(), kHc, 20, kHcEps, zeros.data(), zeros.data(),
                                dcomb.data(), dm.data(), dscale.data(), dbase.data());
  for (int i = 0; i < kHc; ++i) {
    double row = 0, scale_row = 0;
    for (int j = 0; j < kHc; ++j) {
      row += dbase[size_t(2 * kHc + i * kHc + j)];
      scale_row += std::fabs(dbase[size_t(2 * kHc + i * kHc + j)]);
    }
    EXPECT_NEAR(row, 0.0, 1e-14 * (1 + scale_row)) << "row " << i;
  }
}

// The CPU's fp32 version on the same mixes: each logit m·s + b errs by Δ ≤ u (|m s| + |m s + b|);
// pre and post move by σ' ≤ 1/4 of it (twice for post) plus 8 (16) fp32 units for σ's exp, sum and
// division; comb entries by at most 4 Δ (the softmax moves each by ≤ 2Δ relative; Sinkhorn, a
// contraction for positive matrices, does not amplify it) plus (2·iters − 1) normalizations of
// (hc + 2) units each (a sum of hc terms and a division). tests/ops_mhc_test.cpp argues the same
// bound for the CPU op against its own double version.
TEST(GradSinkhorn, ForwardMatchesTheCpuOp) {
  const int iters = 20;
  for (uint32_t seed : {41u, 42u, 43u}) {
    const std::vector<float> mf = test::bf16_normal(kMix, 1.0, seed), bf = test::bf16_normal(kMix, 0.5, seed + 10);
    const std::vector<float> sf = {0.5f, 0.7f, 1.0f};
    float pre_f[kHc], post_f[kHc], comb_f[kHc * kHc];
    split_sinkhorn(mf.data(), sf.data(), bf.data(), kHc, iters, float(kHcEps), pre_f, post_f, comb_f);
    const std::vector<double> m(mf.begin(), mf.end()), b(bf.begin(), bf.end()), s(sf.begin(), sf.end());
    double pre[kHc], post[kHc], comb[kHc * kHc];
    grad::split_sinkhorn_forward(m.data(), s.data(), b.data(), kHc, iters, kHcEps, pre, post, comb);
    double delta = 0;
    for (int k = 0; k < kMix; ++k) {
      const double ms = m[size_t(k)] * s[size_t(k < kHc ? 0 : k < 2 * kHc ? 1 : 2)];
      delta = std::max(delta, test::kF32Unit * (std::fabs(ms) + std::fabs(ms + b[size_t(k)])));
    }
    for (int j = 0; j < kHc; ++j) {
      EXPECT_NEAR(pre_f[j], pre[j], delta / 4 + 8 * test::kF32Unit);
      EXPECT_NEAR(post_f[j], post[j], delta / 2 + 16 * test::kF32Unit);
    }
    for (int k = 0; k < kHc * kHc; ++k)
      EXPECT_NEAR(comb_f[k], comb[k], 4 * delta + (2 * iters - 1) * (kHc + 2) * test::kF32Unit) << "entry " << k;
  }
}

}  // namespace
}  // namespace dsv41
