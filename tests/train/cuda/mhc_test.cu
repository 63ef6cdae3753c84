// train_cuda's hc_pre, hc_post and hc_expand, forward and backward, against src/train/grad/mhc.h
// in float, at V4.1's hc = 4 over rows of 4096 and at odd shapes (hc 1, 2 and 8; d 7, 33, 96).
//
// Tolerances: every value that sums over the streams (y, X', dX, df, dx) is formed with the CPU
// loop's operations in its order: bit for bit. dpre, dpost and dcomb sum over a row's d channels in
// another order (a block tree against the CPU's sequential sum): relative error ≈ 2⁻²⁴ √(d/6)
// (a walk over random-sign terms), ≈ 1.6e-6 at d = 4096, NMSE ≈ 3e-12; bound 1e-10 (a wrong term
// is ≥ 1e-6). The gradients start from non-zero values (the backward adds). Two runs: the same bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "train/cuda/mhc.h"
#include "train/grad/mhc.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct MhcResults {
  std::vector<float> y, out, X_expanded;                      // forwards
  std::vector<float> dX_pre, dpre, df, dX_post, dpost, dcomb, dx;  // backwards
};

TEST(TrainCudaMhc, PrePostExpandMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows;
    int hc;
    int64_t d;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{9, 4, 4096}, Case{3, 2, 96}, Case{5, 1, 7}, Case{4, 8, 33}}) {
    const size_t nX = size_t(c.rows * c.hc * c.d), nrow = size_t(c.rows * c.d), nmix = size_t(c.rows * c.hc);
    const std::vector<float> X = test::normal(nX, 1.0, seed++), f = test::normal(nrow, 1.0, seed++);
    const std::vector<float> pre = test::normal(nmix, 0.5, seed++), post = test::normal(nmix, 1.0, seed++);
    const std::vector<float> comb = test::normal(nmix * size_t(c.hc), 0.5, seed++);
    const std::vector<float> dy = test::normal(nrow, 1.0, seed++), dout = test::normal(nX, 1.0, seed++);
    const std::vector<float> dX0 = test::normal(nX, 0.1, seed++), df0 = test::normal(nrow, 0.1, seed++);
    const std::vector<float> dpre0 = test::normal(nmix, 0.1, seed++), dpost0 = test::normal(nmix, 0.1, seed++);
    const std::vector<float> dcomb0 = test::normal(comb.size(), 0.1, seed++);

    MhcResults want{std::vector<float>(nrow), std::vector<float>(nX), std::vector<float>(nX), dX0, dpre0, df0, dX0,
                    dpost0,                  dcomb0,                  df0};
    grad::hc_pre_forward<float>(X.data(), pre.data(), c.rows, c.hc, c.d, want.y.data());
    grad::hc_pre_backward<float>(X.data(), pre.data(), c.rows, c.hc, c.d, dy.data(), want.dX_pre.data(), want.dpre.data());
    grad::hc_post_forward<float>(f.data(), X.data(), post.data(), comb.data(), c.rows, c.hc, c.d, want.out.data());
    grad::hc_post_backward<float>(f.data(), X.data(), post.data(), comb.data(), c.rows, c.hc, c.d, dout.data(),
                                  want.df.data(), want.dX_post.data(), want.dpost.data(), want.dcomb.data());
    grad::hc_expand_forward<float>(f.data(), c.rows, c.hc, c.d, want.X_expanded.data());
    grad::hc_expand_backward<float>(dout.data(), c.rows, c.hc, c.d, want.dx.data());

    DeviceArray<float> dXin(X), dfin(f), dpre_in(pre), dpost_in(post), dcomb_in(comb), ddy(dy), ddout(dout);
    auto run = [&] {
      DeviceArray<float> y(nrow), out(nX), Xe(nX), dX_pre(dX0), dpre(dpre0), df(df0), dX_post(dX0), dpost(dpost0),
          dcomb(dcomb0), dx(df0);
      y.poison(), out.poison(), Xe.poison();
      train_cuda::hc_pre_forward(dXin.get(), dpre_in.get(), c.rows, c.hc, c.d, y.get());
      train_cuda::hc_pre_backward(dXin.get(), dpre_in.get(), c.rows, c.hc, c.d, ddy.get(), dX_pre.get(), dpre.get());
      train_cuda::hc_post_forward(dfin.get(), dXin.get(), dpost_in.get(), dcomb_in.get(), c.rows, c.hc, c.d, out.get());
      train_cuda::hc_post_backward(dfin.get(), dXin.get(), dpost_in.get(), dcomb_in.get(), c.rows, c.hc, c.d, ddout.get(),
                                   df.get(), dX_post.get(), dpost.get(), dcomb.get());
      train_cuda::hc_expand_forward(dfin.get(), c.rows, c.hc, c.d, Xe.get());
      train_cuda::hc_expand_backward(ddout.get(), c.rows, c.hc, c.d, dx.get());
      return MhcResults{y.download(),      out.download(),   Xe.download(),    dX_pre.download(), dpre.download(),
                        df.download(),     dX_post.download(), dpost.download(), dcomb.download(),  dx.download()};
    };
    const MhcResults got = run();
    EXPECT_TRUE(test::same_bits(got.y, want.y)) << "hc_pre forward";
    EXPECT_TRUE(test::same_bits(got.out, want.out)) << "hc_post forward";
    EXPECT_TRUE(test::same_bits(got.X_expanded, want.X_expanded)) << "hc_expand forward";
    EXPECT_TRUE(test::same_bits(got.dX_pre, want.dX_pre)) << "hc_pre dX";
    EXPECT_TRUE(test::same_bits(got.df, want.df)) << "hc_post df";
    EXPECT_TRUE(test::same_bits(got.dX_post, want.dX_post)) << "hc_post dX";
    EXPECT_TRUE(test::same_bits(got.dx, want.dx)) << "hc_expand dx";
    const double epre = test::nmse(got.dpre, want.dpre), epost = test::nmse(got.dpost, want.dpost);
    const double ecomb = test::nmse(got.dcomb, want.dcomb);
    std::printf("mHC %ld rows x hc %d x %ld: NMSE dpre %.3g dpost %.3g dcomb %.3g\n", long(c.rows), c.hc, long(c.d), epre, epost,
                ecomb);
    EXPECT_LT(epre, 1e-10);
    EXPECT_LT(epost, 1e-10);
    EXPECT_LT(ecomb, 1e-10);

    const MhcResults again = run();
    for (const auto member : {&MhcResults::y, &MhcResults::out, &MhcResults::X_expanded, &MhcResults::dX_pre, &MhcResults::dpre,
                              &MhcResults::df, &MhcResults::dX_post, &MhcResults::dpost, &MhcResults::dcomb, &MhcResults::dx})
      EXPECT_TRUE(test::same_bits(got.*member, again.*member)) << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
