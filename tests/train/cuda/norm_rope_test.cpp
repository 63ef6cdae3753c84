// train_cuda's RMSNorm and RoPE (forward and backward) against src/train/grad/rms_norm.h and
// rope.h in float, on fp32 inputs (no casts: these ops run in fp32), at shapes of the trained
// models and odd ones.
//
// Tolerances:
//  * RMSNorm: every product is rounded in the CPU's order; only the fp32 sums' order differs: the
//    sum of squares (dim positive terms), the row's Σ (w ⊙ dy) x (dim random-sign terms) and dw's
//    sum over the rows (chunks of 64 rows, then the chunks; the CPU adds row by row). Rounding errors
//    of such sums walk: relative error ≈ 2⁻²⁴ √(n/6) (n terms), ≈ 1.6e-6 at n = 4096 for one sum,
//    which moves r and y by at most that relative (NMSE ≈ 3e-12), and dx's second term, 1/√dim of
//    dx, by that relative. Bound NMSE 1e-10 on y, r, dx and dw (> 30× the estimate); a wrong eps,
//    weight or term is ≥ 1e-6.
//  * RoPE: the angle is the same fp32 product; CUDA's cosf/sinf and the C library's differ by at
//    most 3 units of 2⁻²⁴ (within 2 and 1 ulp of the exact value), and each of the rotation's three
//    roundings may then go the other way, so an output moves by at most ~6·2⁻²⁴ (|a| + |b|). With
//    Σ out² = Σ (a² + b²) (a rotation), NMSE ≤ 72·2⁻⁴⁸ = 2.6e-13: bound 1e-12. The channels before
//    the rotated ones are untouched: bit for bit.
//  * Two runs give the same bits; the in-place forward (y = x) is the out-of-place one's bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "train/cuda/norm.h"
#include "train/cuda/rope.h"
#include "train/grad/rms_norm.h"
#include "train/grad/rope.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct NormResults {
  std::vector<float> y, r, dx, dw;
};

NormResults norm_on_device(int64_t rows, int64_t dim, const std::vector<float>* w, const std::vector<float>& x,
                           const std::vector<float>& dy, const std::vector<float>& dx0, const std::vector<float>& dw0) {
  const size_t row_count = size_t(rows);
  DeviceArray<float> xs(x), ws(w ? *w : std::vector<float>{}), ddy(dy), y(x.size()), r(row_count), ddx(dx0), ddw(dw0);
  y.poison(), r.poison();
  const float* wp = w ? ws.get() : nullptr;
  train_cuda::rms_norm_forward(xs.get(), rows, dim, wp, 1e-6f, y.get(), r.get());
  train_cuda::rms_norm_backward(xs.get(), rows, dim, wp, r.get(), ddy.get(), ddx.get(), w ? ddw.get() : nullptr);
  NormResults out{y.download(), r.download(), ddx.download(), ddw.download()};
  // In place: y written over x.
  DeviceArray<float> in_place(x);
  train_cuda::rms_norm_forward(in_place.get(), rows, dim, wp, 1e-6f, in_place.get(), r.get());
  EXPECT_TRUE(test::same_bits(in_place.download(), out.y)) << "in-place forward, " << rows << "x" << dim;
  return out;
}

TEST(TrainCudaRmsNorm, MatchesTheCpuForwardAndBackward) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, dim;
    bool weighted;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{1, 4096, true}, Case{37, 1024, true}, Case{300, 512, true}, Case{64, 4096, true},
                       Case{5, 100, false}, Case{130, 7, true}}) {
    const size_t n = size_t(c.rows * c.dim);
    const std::vector<float> x = test::normal(n, 3.0, seed++), dy = test::normal(n, 1.0, seed++);
    const std::vector<float> w = test::normal(size_t(c.dim), 0.1, seed++, 1.0);
    // Gradients already holding something: the backward adds.
    const std::vector<float> dx0 = test::normal(n, 0.1, seed++);
    const std::vector<float> dw0 = c.weighted ? test::normal(size_t(c.dim), 1.0, seed++) : std::vector<float>{};
    const float* wp = c.weighted ? w.data() : nullptr;

    NormResults want{std::vector<float>(n), {}, dx0, dw0};
    grad::RmsNormSaved<float> saved;
    grad::rms_norm_forward<float>(x.data(), c.rows, c.dim, wp, 1e-6f, want.y.data(), saved);
    want.r = saved.r;
    grad::rms_norm_backward<float>(x.data(), c.rows, c.dim, wp, saved, dy.data(), want.dx.data(),
                                   c.weighted ? want.dw.data() : nullptr);

    const NormResults got = norm_on_device(c.rows, c.dim, c.weighted ? &w : nullptr, x, dy, dx0, dw0);
    const double ey = test::nmse(got.y, want.y), er = test::nmse(got.r, want.r), edx = test::nmse(got.dx, want.dx);
    const double edw = c.weighted ? test::nmse(got.dw, want.dw) : 0.0;
    std::printf("rms_norm %ldx%ld%s: NMSE y %.3g r %.3g dx %.3g dw %.3g\n", long(c.rows), long(c.dim),
                c.weighted ? "" : " unweighted", ey, er, edx, edw);
    for (const double e : {ey, er, edx, edw}) EXPECT_LT(e, 1e-10) << c.rows << "x" << c.dim;

    const NormResults again = norm_on_device(c.rows, c.dim, c.weighted ? &w : nullptr, x, dy, dx0, dw0);
    EXPECT_TRUE(test::same_bits(got.y, again.y) && test::same_bits(got.r, again.r) && test::same_bits(got.dx, again.dx) &&
                test::same_bits(got.dw, again.dw))
        << "two runs differ, " << c.rows << "x" << c.dim;
  }
}

TEST(TrainCudaRope, MatchesTheCpuForwardInverseAndBackward) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, heads, head_dim, rope_dim, max_pos;
  };
  uint32_t seed = 50;
  for (const Case c : {Case{3, 64, 512, 64, int64_t(1) << 20}, Case{5, 1, 512, 64, 70000}, Case{4, 8, 32, 16, 100},
                       Case{7, 3, 10, 6, 1000}}) {
    std::vector<float> freqs(size_t(c.rope_dim / 2));
    for (size_t i = 0; i < freqs.size(); ++i) freqs[i] = float(std::pow(10000.0, -2.0 * double(i) / double(c.rope_dim)));
    std::mt19937 rng(seed++);
    std::vector<int64_t> positions(size_t(c.rows));
    for (int64_t& p : positions) p = int64_t(rng() % uint64_t(c.max_pos));
    const size_t n = size_t(c.rows * c.heads * c.head_dim);
    const std::vector<float> x = test::normal(n, 1.0, seed++);
    DeviceArray<float> dfreqs(freqs);
    DeviceArray<int64_t> dpos(positions);
    for (const bool inverse : {false, true}) {
      for (const bool backward : {false, true}) {
        std::vector<float> want = x;
        if (backward)
          grad::rope_backward<float>(want.data(), c.rows, c.heads, c.head_dim, c.rope_dim, positions.data(), freqs.data(), inverse);
        else
          grad::rope_forward<float>(want.data(), c.rows, c.heads, c.head_dim, c.rope_dim, positions.data(), freqs.data(), inverse);
        auto run = [&] {
          DeviceArray<float> dx(x);
          if (backward)
            train_cuda::rope_backward(dx.get(), c.rows, c.heads, c.head_dim, c.rope_dim, dpos.get(), dfreqs.get(), inverse);
          else
            train_cuda::rope_forward(dx.get(), c.rows, c.heads, c.head_dim, c.rope_dim, dpos.get(), dfreqs.get(), inverse);
          return dx.download();
        };
        const std::vector<float> got = run();
        const double e = test::nmse(got, want);
        std::printf("rope %ldx%ldx%ld (rope %ld)%s%s: NMSE %.3g\n", long(c.rows), long(c.heads), long(c.head_dim),
                    long(c.rope_dim), inverse ? " inverse" : "", backward ? " backward" : "", e);
        EXPECT_LT(e, 1e-12) << c.rows << "x" << c.heads << "x" << c.head_dim;
        size_t untouched_differ = 0;
        for (size_t v = 0; v < n; ++v)
          if (int64_t(v) % c.head_dim < c.head_dim - c.rope_dim && got[v] != x[v]) ++untouched_differ;
        EXPECT_EQ(untouched_differ, 0u) << "channels before the rotated ones changed";
        EXPECT_TRUE(test::same_bits(got, run())) << "two runs differ";
      }
    }
  }
}

}  // namespace
}  // namespace dsv41
