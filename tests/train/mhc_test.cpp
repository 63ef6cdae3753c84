// src/train/grad/mhc.h: the backward of mHC's mixes (projection, RMS, split and Sinkhorn), of the
// collapse into the sub-layer input (hc_pre), of the write-back (hc_post) and of the embedding's
// expansion into the streams, against central differences; the forwards against the CPU ops
// (backend/cpu/mhc.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/mhc.h"
#include "gradcheck.h"
#include "train/grad/mhc.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

constexpr int kHc = 4, kMix = (2 + kHc) * kHc;

grad::HcOptions v41_options() { return grad::HcOptions{kHc, 20, 1e-20, 1e-6}; }

TEST(GradMhc, MixesGradientsMatchCentralDifferences) {
  const int64_t rows = 2, d = 3, K = kHc * d;
  const grad::HcOptions o = v41_options();
  std::vector<double> X = normal_values(size_t(rows * K), 1.0, 1), fn = normal_values(size_t(kMix * K), 0.3, 2);
  std::vector<double> base = normal_values(kMix, 0.5, 3), scale = {0.5, 0.7, 1.0};
  const std::vector<double> cpre = normal_values(size_t(rows * kHc), 1.0, 4), cpost = normal_values(size_t(rows * kHc), 1.0, 5),
                            ccomb = normal_values(size_t(rows * kHc * kHc), 1.0, 6);
  std::vector<double> pre(cpre.size()), post(cpost.size()), comb(ccomb.size());
  grad::HcMixesSaved<double> saved;
  auto loss = [&] {
    grad::hc_mixes_forward(X.data(), rows, d, fn.data(), base.data(), scale.data(), o, pre.data(), post.data(), comb.data(),
                           saved);
    return weighted_sum(cpre, pre) + weighted_sum(cpost, post) + weighted_sum(ccomb, comb);
  };
  loss();
  std::vector<double> dX(X.size(), 0.0), dfn(fn.size(), 0.0), dbase(base.size(), 0.0), dscale(3, 0.0);
  grad::hc_mixes_backward(X.data(), rows, d, fn.data(), base.data(), scale.data(), o, saved, cpre.data(), cpost.data(),
                          ccomb.data(), dX.data(), dfn.data(), dbase.data(), dscale.data());
  expect_gradient("dX", X, dX, loss);
  expect_gradient("dfn", fn, dfn, loss);
  expect_gradient("dbase", base, dbase, loss);
  expect_gradient("dscale", scale, dscale, loss);
}

TEST(GradMhc, PrePostAndExpandGradientsMatchCentralDifferences) {
  const int64_t rows = 2, d = 5;
  std::vector<double> X = normal_values(size_t(rows * kHc * d), 1.0, 7), f = normal_values(size_t(rows * d), 1.0, 8);
  std::vector<double> pre = normal_values(size_t(rows * kHc), 0.5, 9), post = normal_values(size_t(rows * kHc), 0.5, 10);
  std::vector<double> comb = normal_values(size_t(rows * kHc * kHc), 0.5, 11);
  {
    const std::vector<double> c = normal_values(size_t(rows * d), 1.0, 12);
    std::vector<double> y(c.size());
    auto loss = [&] {
      grad::hc_pre_forward(X.data(), pre.data(), rows, kHc, d, y.data());
      return weighted_sum(c, y);
    };
    std::vector<double> dX(X.size(), 0.0), dpre(pre.size(), 0.0);
    grad::hc_pre_backward(X.data(), pre.data(), rows, kHc, d, c.data(), dX.data(), dpre.data());
    expect_gradient("hc_pre dX", X, dX, loss);
    expect_gradient("hc_pre dpre", pre, dpre, loss);
  }
  {
    const std::vector<double> c = normal_values(X.size(), 1.0, 13);
    std::vector<double> out(X.size());
    auto loss = [&] {
      grad::hc_post_forward(f.data(), X.data(), post.data(), comb.data(), rows, kHc, d, out.data());
      return weighted_sum(c, out);
    };
    std::vector<double> df(f.size(), 0.0), dX(X.size(), 0.0), dpost(post.size(), 0.0), dcomb(comb.size(), 0.0);
    grad::hc_post_backward(f.data(), X.data(), post.data(), comb.data(), rows, kHc, d, c.data(), df.data(), dX.data(),
                           dpost.data(), dcomb.data());
    expect_gradient("hc_post df", f, df, loss);
    expect_gradient("hc_post dX", X, dX, loss);
    expect_gradient("hc_post dpost", post, dpost, loss);
    expect_gradient("hc_post dcomb", comb, dcomb, loss);
  }
  {
    const std::vector<double> c = normal_values(X.size(), 1.0, 14);
    std::vector<double> out(X.size());
    auto loss = [&] {
      grad::hc_expand_forward(f.data(), rows, kHc, d, out.data());
      return weighted_sum(c, out);
    };
    std::vector<double> df(f.size(), 0.0);
    grad::hc_expand_backward(c.data(), rows, kHc, d, df.data());
    expect_gradient("hc_expand dx", f, df, loss);
  }
}

// The CPU's hc_mixes on dyadic data (as tests/ops_mhc_test.cpp: streams multiples of 2^-3 up to 2,
// fn multiples of 2^-8 up to 1/4, so the projection and the sum of squares are exact in fp32 and
// only rsqrt and two products round: 4 fp32 units of each scaled logit m·s), and then the split's
// bound of sinkhorn_test.cpp.
TEST(GradMhc, MixesForwardMatchesTheCpuOp) {
  const int64_t rows = 3, d = 64, K = kHc * d;
  const grad::HcOptions o = v41_options();
  std::mt19937 rng(15);
  std::vector<float> Xf(size_t(rows * K)), fnf(size_t(kMix * K));
  for (float& v : Xf) v = float(int(rng() % 33) - 16) * 0.125f;
  for (float& v : fnf) v = float(int(rng() % 129) - 64) * 0x1p-8f;
  const std::vector<float> bf = test::bf16_normal(kMix, 0.5, 16), sf = {0.5f, 0.7f, 1.0f};
  std::vector<float> pre_f(size_t(rows * kHc)), post_f(pre_f.size()), comb_f(size_t(rows * kHc * kHc));
  const HcWeights w{test::f32_view(fnf, kMix, K), test::f32_view(bf, 1, kMix), test::f32_view(sf, 1, 3)};
  hc_mixes(Xf.data(), rows, kHc, d, w, float(o.norm_eps), o.sinkhorn_iters, float(o.hc_eps), pre_f.data(), post_f.data(),
           comb_f.data());

  const std::vector<double> X(Xf.begin(), Xf.end()), fn(fnf.begin(), fnf.end()), b(bf.begin(), bf.end()), s(sf.begin(), sf.end());
  std::vector<double> pre(pre_f.size()), post(post_f.size()), comb(comb_f.size());
  grad::HcMixesSaved<double> saved;
  grad::hc_mixes_forward(X.data(), rows, d, fn.data(), b.data(), s.data(), o, pre.data(), post.data(), comb.data(), saved);
  for (int64_t r = 0; r < rows; ++r) {
    double delta = 0;
    for (int k = 0; k < kMix; ++k) {
      const double ms = saved.raw[size_t(r * kMix + k)] * saved.r[size_t(r)] * s[size_t(k < kHc ? 0 : k < 2 * kHc ? 1 : 2)];
      delta = std::max(delta, test::kF32Unit * (4 * std::fabs(ms) + std::fabs(ms + b[size_t(k)])));
    }
    for (int j = 0; j < kHc; ++j) {
      EXPECT_NEAR(pre_f[size_t(r * kHc + j)], pre[size_t(r * kHc + j)], delta / 4 + 8 * test::kF32Unit);
      EXPECT_NEAR(post_f[size_t(r * kHc + j)], post[size_t(r * kHc + j)], delta / 2 + 16 * test::kF32Unit);
    }
    for (int k = 0; k < kHc * kHc; ++k)
      EXPECT_NEAR(comb_f[size_t(r * kHc * kHc + k)], comb[size_t(r * kHc * kHc + k)],
                  4 * delta + (2 * o.sinkhorn_iters - 1) * (kHc + 2) * test::kF32Unit)
          << "row " << r << " entry " << k;
  }
}

// hc_pre and hc_post on the CPU: fp32 sums of hc (hc + 1) products, rounded to bf16: within
// (hc + 1) fp32 units of the sum of the terms' magnitudes, plus half a bf16 ulp.
TEST(GradMhc, PreAndPostForwardMatchTheCpuOps) {
  const int64_t d = 96;
  const std::vector<float> Xf = test::bf16_normal(size_t(kHc * d), 1.0, 17), ff = test::bf16_normal(size_t(d), 1.0, 18);
  const std::vector<float> pref = {0.7f, 0.1f, 0.15f, 0.05f}, postf = {1.5f, 0.2f, 0.9f, 1.1f};
  const std::vector<float> combf = test::bf16_uniform(size_t(kHc * kHc), 0.0, 0.5, 19);
  std::vector<float> y_f(static_cast<size_t>(d)), out_f(size_t(kHc * d));
  hc_pre(Xf.data(), pref.data(), kHc, d, y_f.data());
  hc_post(ff.data(), Xf.data(), postf.data(), combf.data(), kHc, d, out_f.data());
  const std::vector<double> X(Xf.begin(), Xf.end()), f(ff.begin(), ff.end()), pre(pref.begin(), pref.end()),
      post(postf.begin(), postf.end()), comb(combf.begin(), combf.end());
  std::vector<double> y(static_cast<size_t>(d)), out(size_t(kHc * d));
  grad::hc_pre_forward(X.data(), pre.data(), 1, kHc, d, y.data());
  grad::hc_post_forward(f.data(), X.data(), post.data(), comb.data(), 1, kHc, d, out.data());
  for (int64_t k = 0; k < d; ++k) {
    double mag = 0;
    for (int i = 0; i < kHc; ++i) mag += std::fabs(pre[size_t(i)] * X[size_t(i * d + k)]);
    const double delta = (kHc + 1) * test::kF32Unit * mag;
    EXPECT_NEAR(y_f[size_t(k)], y[size_t(k)], delta + 0.5 * test::bf16_ulp(std::fabs(y[size_t(k)]) + delta)) << k;
    for (int j = 0; j < kHc; ++j) {
      double m2 = std::fabs(post[size_t(j)] * f[size_t(k)]);
      for (int i = 0; i < kHc; ++i) m2 += std::fabs(comb[size_t(i * kHc + j)] * X[size_t(i * d + k)]);
      const double delta2 = (kHc + 1) * test::kF32Unit * m2, v = out[size_t(j * d + k)];
      EXPECT_NEAR(out_f[size_t(j * d + k)], v, delta2 + 0.5 * test::bf16_ulp(std::fabs(v) + delta2)) << j << "," << k;
    }
  }
}

}  // namespace
}  // namespace dsv41
