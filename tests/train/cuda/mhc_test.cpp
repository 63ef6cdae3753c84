// train_cuda's mHC against src/train/grad/mhc.h: hc_mixes (with Sinkhorn) against the CPU's in
// double, hc_pre, hc_post and hc_expand against the CPU's in float, at V4.1's hc = 4 over rows of
// 4096 and at odd shapes (hc 1, 2 and 8; d 7, 33, 96).
//
// hc_mixes' tolerances: float arithmetic in any order against the double reference. The CPU's float
// path measured NMSE 1.5e-15 … 7.6e-14 on pre, post and comb and 1.3e-15 … 6.9e-13 on the
// gradients (dscale's three sums over rows·hc² terms the largest) over this test's five shapes; the
// device's only other operations are its expf and its sums' order, which draw errors of the same
// size. Bounds 1e-11 (forward) and 1e-10 (backward): ≥ 130× the measured; a lost term of raw, a
// wrong iterate or a missing normalization is ≥ 1e-6. Two runs: the same bits.
//
// hc_pre, hc_post, hc_expand tolerances: every value that sums over the streams (y, X', dX, df, dx) is formed with the CPU
// loop's operations in its order: bit for bit. dpre, dpost and dcomb sum over a row's d channels in
// another order (a block tree against the CPU's sequential sum): relative error ≈ 2⁻²⁴ √(d/6)
// (a walk over random-sign terms), ≈ 1.6e-6 at d = 4096, NMSE ≈ 3e-12; bound 1e-10 (a wrong term
// is ≥ 1e-6). The gradients start from non-zero values (the backward adds). Two runs: the same bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <cmath>
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

struct MixResults {
  std::vector<float> pre, post, comb, dX, dfn, dbase, dscale;
};

std::vector<float> as_float(const std::vector<double>& x) { return std::vector<float>(x.begin(), x.end()); }

TEST(TrainCudaMhc, MixesWithSinkhornMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows;
    int hc;
    int64_t d;
    int iters;
  };
  train_cuda::Blas blas;
  uint32_t seed = 100;
  for (const Case c : {Case{64, 4, 512, 20}, Case{256, 4, 1024, 20}, Case{5, 2, 33, 3}, Case{3, 8, 16, 20}, Case{7, 1, 40, 1}}) {
    const int n_mix = (2 + c.hc) * c.hc;
    const int64_t K = c.hc * c.d;
    const size_t nX = size_t(c.rows * K), nfn = size_t(n_mix * K), nrow = size_t(c.rows * c.hc);
    // fn's scale puts m = raw · r near 1, where the sigmoids and the softmax are not saturated.
    const std::vector<float> X = test::normal(nX, 1.0, seed++), fn = test::normal(nfn, 1.0 / std::sqrt(double(K)), seed++);
    const std::vector<float> base = test::normal(size_t(n_mix), 0.5, seed++), scale = {0.8f, 1.1f, 1.3f};
    const std::vector<float> dpre = test::normal(nrow, 1.0, seed++), dpost = test::normal(nrow, 1.0, seed++);
    const std::vector<float> dcomb = test::normal(nrow * size_t(c.hc), 1.0, seed++);
    const std::vector<float> dX0 = test::normal(nX, 0.1, seed++), dfn0 = test::normal(nfn, 0.1, seed++);
    const std::vector<float> dbase0 = test::normal(size_t(n_mix), 0.1, seed++), dscale0 = test::normal(3, 0.1, seed++);

    // The reference in double from the same float inputs.
    auto wide = [](const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); };
    const grad::HcOptions ho{c.hc, c.iters, 1e-20, 1e-6};
    grad::HcMixesSaved<double> saved;
    std::vector<double> pre(nrow), post(nrow), comb(nrow * size_t(c.hc));
    const std::vector<double> Xd = wide(X), fnd = wide(fn), based = wide(base), scaled = wide(scale);
    grad::hc_mixes_forward<double>(Xd.data(), c.rows, c.d, fnd.data(), based.data(), scaled.data(), ho, pre.data(), post.data(),
                                   comb.data(), saved);
    std::vector<double> dX = wide(dX0), dfn = wide(dfn0), dbase = wide(dbase0), dscale = wide(dscale0);
    const std::vector<double> dpred = wide(dpre), dpostd = wide(dpost), dcombd = wide(dcomb);
    grad::hc_mixes_backward<double>(Xd.data(), c.rows, c.d, fnd.data(), based.data(), scaled.data(), ho, saved, dpred.data(),
                                    dpostd.data(), dcombd.data(), dX.data(), dfn.data(), dbase.data(), dscale.data());
    const MixResults want{as_float(pre), as_float(post), as_float(comb), as_float(dX), as_float(dfn), as_float(dbase),
                          as_float(dscale)};

    const train_cuda::HcMixOptions o{c.hc, c.iters, 1e-20f, 1e-6f};
    DeviceArray<float> dXin(X), dfn_in(fn), dbase_in(base), dscale_in(scale), ddpre(dpre), ddpost(dpost), ddcomb(dcomb);
    auto run = [&] {
      DeviceArray<float> gpre(nrow), gpost(nrow), gcomb(nrow * size_t(c.hc)), raw(size_t(c.rows * n_mix)), r(size_t(c.rows));
      DeviceArray<float> gdX(dX0), gdfn(dfn0), gdbase(dbase0), gdscale(dscale0);
      gpre.poison(), gpost.poison(), gcomb.poison(), raw.poison(), r.poison();
      train_cuda::hc_mixes_forward(blas, dXin.get(), c.rows, c.d, dfn_in.get(), dbase_in.get(), dscale_in.get(), o, gpre.get(),
                                   gpost.get(), gcomb.get(), raw.get(), r.get());
      train_cuda::hc_mixes_backward(blas, dXin.get(), c.rows, c.d, dfn_in.get(), dbase_in.get(), dscale_in.get(), o, raw.get(),
                                    r.get(), ddpre.get(), ddpost.get(), ddcomb.get(), gdX.get(), gdfn.get(), gdbase.get(),
                                    gdscale.get());
      return MixResults{gpre.download(), gpost.download(), gcomb.download(), gdX.download(),
                        gdfn.download(), gdbase.download(), gdscale.download()};
    };
    const MixResults got = run();
    const double e[7] = {test::nmse(got.pre, want.pre), test::nmse(got.post, want.post),   test::nmse(got.comb, want.comb),
                         test::nmse(got.dX, want.dX),   test::nmse(got.dfn, want.dfn),     test::nmse(got.dbase, want.dbase),
                         test::nmse(got.dscale, want.dscale)};
    std::printf("hc_mixes %ld rows x hc %d x %ld, %d sweeps: NMSE pre %.3g post %.3g comb %.3g dX %.3g dfn %.3g dbase %.3g "
                "dscale %.3g\n",
                long(c.rows), c.hc, long(c.d), c.iters, e[0], e[1], e[2], e[3], e[4], e[5], e[6]);
    for (int i = 0; i < 3; ++i) EXPECT_LT(e[i], 1e-11) << "forward output " << i;
    for (int i = 3; i < 7; ++i) EXPECT_LT(e[i], 1e-10) << "gradient " << i - 3;

    const MixResults again = run();
    for (const auto member : {&MixResults::pre, &MixResults::post, &MixResults::comb, &MixResults::dX, &MixResults::dfn,
                              &MixResults::dbase, &MixResults::dscale})
      EXPECT_TRUE(test::same_bits(got.*member, again.*member)) << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
