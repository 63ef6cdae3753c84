// cuda::rms_norm, cuda::rope and the mHC ops against the CPU ops on the same random inputs, at the
// V4.1-Flash shapes (dim 5120, q_lora 1280, 64 heads × 512 with 64 rotated, hc_mult 4) and small ones.
//
// Tolerances:
//  * hc_pre, hc_post: bit for bit. Same operations in the same order, each product rounded (no
//    FMA contraction on either side), same final bf16 rounding.
//  * rms_norm: only the order of the fp32 sum of squares differs. The CPU adds the squares one by
//    one, which errs by up to n fp32 units (typically ~√n ≈ 70 for n = 5120, 4e-6 relative), and
//    that error scales every output of the row; an output moves by one bf16 unit (2^-8) when it
//    sits that close to a rounding boundary, ~1e-3 of them, so NMSE ≈ 1e-3 · 2^-16 · E[w²x²]/E[..]
//    ~ 1e-8 (1.3e-8 measured on the H200 for one 5120 row). Bound 1e-6: a wrong weight, eps or
//    statistic gives NMSE > 1e-4.
//  * rope: CUDA's cosf/sinf and the C library's may differ in the last bit (≤ 2 fp32 units); the
//    same boundary argument gives NMSE ≪ 1e-8, the bound.
//  * hc_mixes: the 24 projections over hc·d = 20480 and the sum of squares are fp32 sums in another
//    order (relative error ~ sqrt(n) fp32 units ≈ 1e-5 of the sum of |terms| in the worst case,
//    far less typically); Sinkhorn's 20 normalizations are the CPU's steps in its order and expf may differ in
//    the last bit. NMSE bound 1e-9 on pre, post and comb (outputs O(1), unrounded).
//  * mega_mhc against the CPU composition hc_post → hc_mixes, hc_pre → rms_norm: the updated
//    residual bit for bit (hc_post's operations), the coefficients under hc_mixes' bound (1e-9),
//    the normalized input under rms_norm's (1e-6): the fused kernel only reorders the same sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/mhc.h"
#include "backend/cpu/norm.h"
#include "backend/cpu/rope.h"
#include "backend/cuda/mhc.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/rope.h"
#include "device_util.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(CudaRmsNorm, MatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int rows, dim;
    WeightFormat wf;
    bool weighted;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{1, 5120, WeightFormat::BF16, true}, Case{7, 1280, WeightFormat::F32, true},
                       Case{5, 512, WeightFormat::BF16, true}, Case{3, 5120, WeightFormat::F32, false},
                       Case{2, 100, WeightFormat::F32, true}}) {
    const std::vector<float> x = test::bf16_normal(size_t(c.rows) * c.dim, 3.0, seed++);
    const test::OwnedWeight w = test::make_weight(c.wf, test::bf16_normal(c.dim, 1.0, seed++), 1, c.dim);
    std::vector<float> want(x.size());
    const Weight hw = w.view();
    rms_norm(x.data(), c.rows, c.dim, c.weighted ? &hw : nullptr, 1e-6f, want.data());
    DeviceArray<float> dx(x), dy(x.size());
    DeviceArray<uint8_t> dwd(w.data);
    Weight dw = hw;
    dw.data = dwd.get();
    dy.poison();
    cuda::rms_norm(dx.get(), c.rows, c.dim, c.weighted ? &dw : nullptr, 1e-6f, dy.get());
    const double e = test::nmse(dy.download(), want);
    std::printf("rms_norm %dx%d NMSE %.3g\n", c.rows, c.dim, e);
    EXPECT_LT(e, 1e-6) << c.rows << "x" << c.dim;
  }
}

TEST(CudaRope, MatchesCpuForwardAndInverse) {
  DSV41_REQUIRE_DEVICE();
  // V4.1: 64 query heads of 512, the last 64 channels rotated, YaRN on; positions up to 1M.
  struct Case {
    int rows, heads, head_dim, rope_dim;
    int64_t max_pos;
  };
  uint32_t seed = 50;
  // Heads in groups of 8, 1, 8, 2 and 4 a thread (rope.cu).
  for (const Case c : {Case{3, 64, 512, 64, 1 << 20}, Case{5, 1, 512, 64, 70000}, Case{4, 8, 32, 16, 100},
                       Case{2, 6, 64, 32, 5000}, Case{3, 12, 64, 16, 300}}) {
    const RopeTable table(c.rope_dim, 10000, 65536, 16, 32, 1);
    std::mt19937 rng(seed);
    std::vector<int64_t> pos(static_cast<size_t>(c.rows));
    for (int64_t& p : pos) p = int64_t(rng() % uint64_t(c.max_pos));
    for (bool inverse : {false, true}) {
      std::vector<float> x = test::bf16_normal(size_t(c.rows) * c.heads * c.head_dim, 1.0, seed++);
      DeviceArray<float> dx(x);
      DeviceArray<int64_t> dpos(pos);
      DeviceArray<float> dfreq(table.frequencies());
      for (int r = 0; r < c.rows; ++r)
        for (int h = 0; h < c.heads; ++h)
          table.apply(x.data() + (size_t(r) * c.heads + h) * c.head_dim + c.head_dim - c.rope_dim, pos[size_t(r)], inverse);
      cuda::rope(dx.get() + (c.head_dim - c.rope_dim), c.rows, c.heads, int64_t(c.heads) * c.head_dim, c.head_dim,
                 c.rope_dim, dpos.get(), dfreq.get(), inverse);
      const double e = test::nmse(dx.download(), x);
      std::printf("rope %dx%dx%d inverse=%d NMSE %.3g\n", c.rows, c.heads, c.head_dim, int(inverse), e);
      EXPECT_LT(e, 1e-8);
    }
  }
}

struct HcCase {
  int rows, hc, d;
};

TEST(CudaMhc, MixesMatchCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 200;
  for (const HcCase c : {HcCase{1, 4, 5120}, HcCase{6, 4, 5120}, HcCase{3, 4, 128}, HcCase{2, 2, 96}}) {
    const int n = c.hc * c.d, n_mix = (2 + c.hc) * c.hc;
    const std::vector<float> X = test::bf16_normal(size_t(c.rows) * n, 1.0, seed++);
    const std::vector<float> fn = test::bf16_normal(size_t(n_mix) * n, 1.0 / std::sqrt(double(n)), seed++);
    const std::vector<float> base = test::bf16_normal(size_t(n_mix), 1.0, seed++);
    const std::vector<float> scale = {0.75f, 1.25f, 2.0f};
    const HcWeights hw{test::f32_view(fn, n_mix, n), test::f32_view(base, 1, n_mix), test::f32_view(scale, 1, 3)};
    std::vector<float> pre(size_t(c.rows) * c.hc), post(pre.size()), comb(size_t(c.rows) * c.hc * c.hc);
    hc_mixes(X.data(), c.rows, c.hc, c.d, hw, 1e-20f, 20, 1e-6f, pre.data(), post.data(), comb.data());

    DeviceArray<float> dX(X), dfn(fn), dbase(base), dscale(scale);
    DeviceArray<float> dpre(pre.size()), dpost(post.size()), dcomb(comb.size());
    dpre.poison(), dpost.poison(), dcomb.poison();
    HcWeights dw = hw;
    dw.fn.data = reinterpret_cast<const uint8_t*>(dfn.get());
    dw.base.data = reinterpret_cast<const uint8_t*>(dbase.get());
    dw.scale.data = reinterpret_cast<const uint8_t*>(dscale.get());
    cuda::hc_mixes(dX.get(), c.rows, c.hc, c.d, dw, 1e-20f, 20, 1e-6f, dpre.get(), dpost.get(), dcomb.get());
    const double e_pre = test::nmse(dpre.download(), pre), e_post = test::nmse(dpost.download(), post),
                 e_comb = test::nmse(dcomb.download(), comb);
    std::printf("hc_mixes %dx%dx%d NMSE pre %.3g post %.3g comb %.3g\n", c.rows, c.hc, c.d, e_pre, e_post, e_comb);
    EXPECT_LT(e_pre, 1e-9);
    EXPECT_LT(e_post, 1e-9);
    EXPECT_LT(e_comb, 1e-9);
  }
}

TEST(CudaMhc, PreAndPostMatchCpuBitForBit) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 300;
  for (const HcCase c : {HcCase{1, 4, 5120}, HcCase{9, 4, 5120}, HcCase{3, 2, 96}}) {
    const size_t n = size_t(c.rows) * c.hc * c.d;
    const std::vector<float> X = test::bf16_normal(n, 1.0, seed++), f = test::bf16_normal(size_t(c.rows) * c.d, 1.0, seed++);
    const std::vector<float> pre = test::bf16_uniform(size_t(c.rows) * c.hc, 0.0, 1.0, seed++);
    const std::vector<float> post = test::bf16_uniform(size_t(c.rows) * c.hc, 0.0, 2.0, seed++);
    std::vector<float> comb(size_t(c.rows) * c.hc * c.hc);
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& v : comb) v = u(rng);  // fp32, as Sinkhorn leaves it

    std::vector<float> want_pre(size_t(c.rows) * c.d), want_post(n);
    for (int r = 0; r < c.rows; ++r) {
      const float* Xr = X.data() + size_t(r) * c.hc * c.d;
      hc_pre(Xr, pre.data() + r * c.hc, c.hc, c.d, want_pre.data() + size_t(r) * c.d);
      hc_post(f.data() + size_t(r) * c.d, Xr, post.data() + r * c.hc, comb.data() + r * c.hc * c.hc, c.hc, c.d,
              want_post.data() + size_t(r) * c.hc * c.d);
    }
    DeviceArray<float> dX(X), df(f), dpre(pre), dpost(post), dcomb(comb), ypre(want_pre.size()), ypost(n);
    ypre.poison(), ypost.poison();
    cuda::hc_pre(dX.get(), dpre.get(), c.rows, c.hc, c.d, ypre.get());
    cuda::hc_post(df.get(), dX.get(), dpost.get(), dcomb.get(), c.rows, c.hc, c.d, ypost.get());
    const std::vector<float> got_pre = ypre.download(), got_post = ypost.download();
    size_t differ = 0;
    for (size_t i = 0; i < got_pre.size(); ++i) differ += float_bits(got_pre[i]) != float_bits(want_pre[i]);
    for (size_t i = 0; i < got_post.size(); ++i) differ += float_bits(got_post[i]) != float_bits(want_post[i]);
    EXPECT_EQ(differ, 0u) << c.rows << "x" << c.hc << "x" << c.d;
  }
}

// One Mega-mHC case: random inputs of `rows` tokens on the host and on the device, and a call over
// rows [r0, r0 + n) into the device outputs (poisoned at construction).
struct MegaCase {
  HcCase c;
  int n, n_mix;
  std::vector<float> X, f, pre_in, post, comb, fn, base, scale, norm;
  HcWeights hw;
  Weight nw;
  std::unique_ptr<DeviceArray<float>> dX, df, dpre_in, dpost, dcomb, dfn, dbase, dscale, dnorm, dXo, dh, dpre, dpost2,
      dcomb2;
  static constexpr float kEps = 1e-6f;

  MegaCase(HcCase c_, uint32_t seed) : c(c_), n(c_.hc * c_.d), n_mix((2 + c_.hc) * c_.hc) {
    const size_t streams = size_t(c.rows) * n;
    X = test::bf16_normal(streams, 1.0, seed++), f = test::bf16_normal(size_t(c.rows) * c.d, 1.0, seed++);
    pre_in = test::bf16_uniform(size_t(c.rows) * c.hc, 0.0, 1.0, seed++);
    post = test::bf16_uniform(size_t(c.rows) * c.hc, 0.0, 2.0, seed++);
    comb.resize(size_t(c.rows) * c.hc * c.hc);
    std::mt19937 rng(seed++);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& v : comb) v = u(rng);
    fn = test::bf16_normal(size_t(n_mix) * n, 1.0 / std::sqrt(double(n)), seed++);
    base = test::bf16_normal(size_t(n_mix), 1.0, seed++);
    scale = {0.75f, 1.25f, 2.0f};
    norm = test::bf16_uniform(size_t(c.d), 0.5, 1.5, seed++);
    hw = HcWeights{test::f32_view(fn, n_mix, n), test::f32_view(base, 1, n_mix), test::f32_view(scale, 1, 3)};
    nw = test::f32_view(norm, 1, c.d);
    auto up = [](const std::vector<float>& v) { return std::make_unique<DeviceArray<float>>(v); };
    auto out = [](size_t size) {
      auto a = std::make_unique<DeviceArray<float>>(size);
      a->poison();
      return a;
    };
    dX = up(X), df = up(f), dpre_in = up(pre_in), dpost = up(post), dcomb = up(comb), dfn = up(fn), dbase = up(base);
    dscale = up(scale), dnorm = up(norm);
    dXo = out(streams), dh = out(size_t(c.rows) * c.d), dpre = out(size_t(c.rows) * c.hc);
    dpost2 = out(size_t(c.rows) * c.hc), dcomb2 = out(comb.size());
  }

  // The hc and norm weights' views of their device copies.
  HcWeights device_hc() const {
    HcWeights dw = hw;
    dw.fn.data = reinterpret_cast<const uint8_t*>(dfn->get());
    dw.base.data = reinterpret_cast<const uint8_t*>(dbase->get());
    dw.scale.data = reinterpret_cast<const uint8_t*>(dscale->get());
    return dw;
  }
  Weight device_norm() const {
    Weight dnw = nw;
    dnw.data = reinterpret_cast<const uint8_t*>(dnorm->get());
    return dnw;
  }

  void run(int r0, int rows) {
    const HcWeights dw = device_hc();
    const Weight dnw = device_norm();
    const int hc = c.hc, d = c.d;
    cuda::mega_mhc(df->get() + r0 * d, dX->get() + size_t(r0) * n, dpost->get() + r0 * hc, dcomb->get() + r0 * hc * hc,
                   dpre_in->get() + r0 * hc, rows, hc, d, dw, &dnw, kEps, 20, 1e-6f, dXo->get() + size_t(r0) * n,
                   dh->get() + r0 * d, dpre->get() + r0 * hc, dpost2->get() + r0 * hc, dcomb2->get() + r0 * hc * hc);
  }

  // Every device output, downloaded.
  std::vector<std::vector<float>> outputs() const {
    return {dXo->download(), dh->download(), dpre->download(), dpost2->download(), dcomb2->download()};
  }
  void poison() { dXo->poison(), dh->poison(), dpre->poison(), dpost2->poison(), dcomb2->poison(); }
};

TEST(CudaMhc, MegaMhcMatchesTheCpuComposition) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 400;
  // 520 rows take the prefill form (blocks of 16 rows, the last group partial), 66 the middle one
  // (blocks of 4, the last partial), the others the decode form.
  for (const HcCase c : {HcCase{1, 4, 5120}, HcCase{5, 4, 5120}, HcCase{2, 4, 200}, HcCase{3, 2, 96}, HcCase{66, 4, 5120},
                         HcCase{520, 4, 5120}}) {
    MegaCase m(c, seed);
    seed += 16;
    const int n = m.n;
    const size_t streams = size_t(c.rows) * n;
    // The forward's order: write back, then the next sub-layer's mixes, input and norm.
    std::vector<float> Xo(streams), h(size_t(c.rows) * c.d), pre(size_t(c.rows) * c.hc), post2(pre.size()),
        comb2(m.comb.size());
    for (int r = 0; r < c.rows; ++r)
      hc_post(m.f.data() + size_t(r) * c.d, m.X.data() + size_t(r) * n, m.post.data() + r * c.hc,
              m.comb.data() + r * c.hc * c.hc, c.hc, c.d, Xo.data() + size_t(r) * n);
    hc_mixes(Xo.data(), c.rows, c.hc, c.d, m.hw, MegaCase::kEps, 20, 1e-6f, pre.data(), post2.data(), comb2.data());
    for (int r = 0; r < c.rows; ++r)
      hc_pre(Xo.data() + size_t(r) * n, m.pre_in.data() + r * c.hc, c.hc, c.d, h.data() + size_t(r) * c.d);
    rms_norm(h.data(), c.rows, c.d, &m.nw, MegaCase::kEps, h.data());

    // Twice: the second call finds the arrival counters the first one left (they must be reset).
    for (int call = 0; call < 2; ++call) {
      m.run(0, c.rows);
      const std::vector<std::vector<float>> got = m.outputs();
      size_t differ = 0;
      for (size_t i = 0; i < streams; ++i) differ += float_bits(got[0][i]) != float_bits(Xo[i]);
      const double e_h = test::nmse(got[1], h), e_pre = test::nmse(got[2], pre), e_post = test::nmse(got[3], post2),
                   e_comb = test::nmse(got[4], comb2);
      std::printf("mega_mhc %dx%dx%d call %d: Xo differ %zu, NMSE h %.3g pre %.3g post %.3g comb %.3g\n", c.rows, c.hc,
                  c.d, call, differ, e_h, e_pre, e_post, e_comb);
      EXPECT_EQ(differ, 0u);
      EXPECT_LT(e_h, 1e-6);
      EXPECT_LT(e_pre, 1e-9);
      EXPECT_LT(e_post, 1e-9);
      EXPECT_LT(e_comb, 1e-9);
      m.poison();
    }
  }
}

// A row's results do not depend on the rows called with it: 515 rows in one call (the prefill form:
// groups of 16, the last partial) equal, bit for bit, the same rows in calls of 1 to 5 rows (the
// decode form) and in calls of 37 to 200 rows (the middle form: groups of 4), every output. A sum taken in another order, a group
// bound off by one or a row finished before its sums were all in shows up as differing bits.
TEST(CudaMhc, MegaMhcRowsDoNotDependOnTheCall) {
  DSV41_REQUIRE_DEVICE();
  for (const HcCase c : {HcCase{515, 4, 5120}, HcCase{515, 2, 200}}) {
    MegaCase m(c, 900);
    m.run(0, c.rows);
    const std::vector<std::vector<float>> whole = m.outputs();
    auto expect_whole = [&](const std::string& calls) {
      const std::vector<std::vector<float>> parts = m.outputs();
      for (size_t o = 0; o < whole.size(); ++o) {
        size_t differ = 0;
        for (size_t i = 0; i < whole[o].size(); ++i) differ += float_bits(whole[o][i]) != float_bits(parts[o][i]);
        EXPECT_EQ(differ, 0u) << "output " << o << " of " << c.rows << "x" << c.hc << "x" << c.d << ", " << calls;
      }
    };
    m.poison();
    for (int r0 = 0, n = 1; r0 < c.rows; r0 += n, n = n % 5 + 1) m.run(r0, std::min(n, c.rows - r0));
    expect_whole("calls of 1 to 5 rows");
    m.poison();
    int r0 = 0;
    for (const int n : {64, 37, 130, 200, 84}) m.run(r0, n), r0 += n;
    expect_whole("calls of 37 to 200 rows");
  }
}

}  // namespace
}  // namespace dsv41
