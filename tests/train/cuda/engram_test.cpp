// train_cuda's Engram gate, forward and backward, against src/train/grad/engram.h in float: 4
// streams over 4096 channels and odd shapes (1, 2 and 8 streams; 96, 33, 7 channels).
//
// Tolerance: the same operations in the same order except the sums over d (A, h², key², dg: block
// trees against the CPU's sequential sums; relative error ≈ 2⁻²⁴ √(d/6) for random-sign terms,
// 1.6e-6 at d = 4096) and over the tokens for the weights' gradients (64-token chunks), and expf's
// last bits. dot, g and every output then move by a few 1e-6 relative at most (the root's slope
// 1/(2√|dot|) halves dot's relative error): NMSE ≲ 1e-11. Bound 1e-10 on h', the saved A, rh, rk,
// dot, gate, and dX, dkv, dq_weight, dk_weight (which start from non-zero values); a wrong term is
// ≥ 1e-6. The data keep every |dot| above 1e-4, far from the clamp at 1e-6 (asserted), so both sides
// take the same branch. Two runs: the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "train/cuda/engram.h"
#include "train/grad/engram.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaEngram, GateMatchesTheCpu) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows;
    int hc;
    int64_t d;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{6, 4, 4096}, Case{70, 2, 96}, Case{9, 1, 33}, Case{2, 8, 7}}) {
    const size_t nX = size_t(c.rows * c.hc * c.d), nkv = size_t(c.rows * (c.hc + 1) * c.d), nw = size_t(c.hc * c.d);
    const size_t ns = size_t(c.rows * c.hc);
    const std::vector<float> X = test::normal(nX, 1.0, seed++), kv = test::normal(nkv, 1.0, seed++);
    const std::vector<float> qw = test::normal(nw, 0.1, seed++, 1.0), kw = test::normal(nw, 0.1, seed++, 1.0);
    const std::vector<float> dout = test::normal(nX, 1.0, seed++);
    const std::vector<float> dX0 = test::normal(nX, 0.1, seed++), dkv0 = test::normal(nkv, 0.1, seed++);
    const std::vector<float> dq0 = test::normal(nw, 0.1, seed++), dk0 = test::normal(nw, 0.1, seed++);
    const float eps = 1e-6f;

    grad::EngramGateSaved<float> saved;
    std::vector<float> out(nX), dX = dX0, dkv = dkv0, dq = dq0, dk = dk0;
    grad::engram_gate_forward<float>(X.data(), kv.data(), qw.data(), kw.data(), c.rows, c.hc, c.d, eps, out.data(), saved);
    for (const float v : saved.dot) ASSERT_GT(std::fabs(v), 1e-4f) << "a dot near the clamp: the data must keep it away";
    grad::engram_gate_backward<float>(X.data(), kv.data(), qw.data(), kw.data(), c.rows, c.hc, c.d, saved, dout.data(), dX.data(),
                                      dkv.data(), dq.data(), dk.data());

    DeviceArray<float> dXin(X), dkvin(kv), dqw(qw), dkw(kw), ddout(dout);
    struct Got {
      std::vector<float> out, A, rh, rk, dot, gate, dX, dkv, dq, dk;
    };
    auto run = [&] {
      DeviceArray<float> o(nX), A(ns), rh(ns), rk(ns), dot(ns), gate(ns), gX(dX0), gkv(dkv0), gq(dq0), gk(dk0);
      o.poison();
      const train_cuda::EngramGateSaved s{A.get(), rh.get(), rk.get(), dot.get(), gate.get()};
      train_cuda::engram_gate_forward(dXin.get(), dkvin.get(), dqw.get(), dkw.get(), c.rows, c.hc, c.d, eps, o.get(), s);
      train_cuda::engram_gate_backward(dXin.get(), dkvin.get(), dqw.get(), dkw.get(), c.rows, c.hc, c.d, s, ddout.get(), gX.get(),
                                       gkv.get(), gq.get(), gk.get());
      return Got{o.download(),  A.download(),  rh.download(),  rk.download(), dot.download(),
                 gate.download(), gX.download(), gkv.download(), gq.download(), gk.download()};
    };
    const Got got = run();
    const double e[10] = {test::nmse(got.out, out),        test::nmse(got.A, saved.A),       test::nmse(got.rh, saved.rh),
                          test::nmse(got.rk, saved.rk),    test::nmse(got.dot, saved.dot),   test::nmse(got.gate, saved.gate),
                          test::nmse(got.dX, dX),          test::nmse(got.dkv, dkv),         test::nmse(got.dq, dq),
                          test::nmse(got.dk, dk)};
    std::printf("engram gate %ld rows x %d x %ld: NMSE out %.3g A %.3g rh %.3g rk %.3g dot %.3g gate %.3g dX %.3g dkv %.3g "
                "dq %.3g dk %.3g\n",
                long(c.rows), c.hc, long(c.d), e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8], e[9]);
    for (const double v : e) EXPECT_LT(v, 1e-10) << c.rows << "x" << c.hc << "x" << c.d;
    const Got again = run();
    for (const auto member : {&Got::out, &Got::A, &Got::rh, &Got::rk, &Got::dot, &Got::gate, &Got::dX, &Got::dkv, &Got::dq,
                              &Got::dk})
      EXPECT_TRUE(test::same_bits(got.*member, again.*member)) << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
