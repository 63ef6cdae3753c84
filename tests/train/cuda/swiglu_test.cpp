// train_cuda's clamped SwiGLU, alone and composed into an expert with linear.h's bf16 products,
// against src/train/grad/swiglu_expert.h in float.
//
// Alone (the activation's formulas, clamps included): the CPU expert with W1 = I, W3 = 2I, W2 = I
// (dim = inter) computes g = x, u = 2x, y = h and dx = dg + 2 du exactly (products by 0, 1 and 2 are
// exact, sums of zeros add nothing), so the device activation is fed g = x, u = 2x and compared with
// the CPU's h, dx and routing-weight gradient. The clamps are decided on the same values on both
// sides; x holds values past the limit L = 10 for g and for u (|x| > 5), exactly at the bounds
// (x = 10, x = ±5), where the gradient passes, and one past both (x = 12). The same operations in
// the same order, except expf (CUDA's and the C library's differ by at most 3 units of 2⁻²⁴) and the
// routing weight's sum over the row (another order: relative error ≈ 2⁻²⁴ √(inter/6) ≈ 1e-6 at
// inter 2048). Bounds: NMSE 1e-11 on h and dx (each element within ~10·2⁻²⁴ relative: NMSE ≤
// 4e-13), 1e-10 on the routing weights' gradient; a clamp decided the other way or a wrong term is
// ≥ 1e-6.
//
// Composed (the expert as the trainer runs it: x, W1, W2, W3, the hidden and the gradients dy, dg,
// du cast to bf16 before their products, straight through): each cast errs by at most u = 2⁻⁸
// relative, variance ≤ u²/3. A product of two cast operands has NMSE ≈ 2u²/3; through the
// activation (whose slope ratio is at most ~1.3) the hidden's NMSE is ≈ 4u²/3, and each later product
// adds its operands' casts: y, dW2 ≈ 2u²; dh ≈ 2u²/3, dg and du ≈ 1.5u², dx, dW1, dW3 ≈ 2.5u²; the
// routing weights' gradient ≈ 2u². Bound 16u² = 2.4e-4 on every output (≥ 6× those); a lost term
// or a swapped product is ≥ 1e-2. The data keep every g and u a margin of 1 inside the clamps (the
// casts move them by ~0.2 at most), so no clamp is decided differently.
//
// Both: two runs give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "train/cuda/linear.h"
#include "train/cuda/swiglu.h"
#include "train/grad/swiglu_expert.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

constexpr float kLimit = 10.0f;

std::vector<float> uniform(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = float(dist(rng));
  return v;
}

TEST(TrainCudaSwiglu, ActivationMatchesTheCpuExpertWithIdentityProducts) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, d;
    float limit;
    bool weighted;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{16, 2048, kLimit, true}, Case{33, 512, kLimit, false}, Case{5, 100, kLimit, true},
                       Case{1, 7, kLimit, true}, Case{9, 64, 0.0f, true}}) {
    const size_t n = size_t(c.rows * c.d);
    std::vector<float> x = test::normal(n, 6.0, seed++);
    // g at its bound; u = ±10 at its bounds; g and u past them (every case has n ≥ 4).
    x[0] = 10.0f, x[1] = 5.0f, x[2] = -5.0f, x[3] = 12.0f;
    const std::vector<float> dy = test::normal(n, 1.0, seed++);
    const std::vector<float> rw = uniform(size_t(c.rows), 0.1, 1.0, seed++);
    const std::vector<float> drw0 = test::normal(size_t(c.rows), 1.0, seed++);
    std::vector<float> identity(size_t(c.d * c.d), 0.0f), twice(identity.size(), 0.0f);
    for (int64_t i = 0; i < c.d; ++i) identity[size_t(i * c.d + i)] = 1.0f, twice[size_t(i * c.d + i)] = 2.0f;
    const float* rwp = c.weighted ? rw.data() : nullptr;

    grad::ExpertSaved<float> saved;
    std::vector<float> y(n), dx(n, 0.0f), dw1(identity.size(), 0.0f), dw2(dw1), dw3(dw1), drw = drw0;
    grad::expert_forward<float>(x.data(), c.rows, c.d, identity.data(), identity.data(), twice.data(), c.d, c.limit, rwp,
                                y.data(), saved);
    grad::expert_backward<float>(x.data(), c.rows, c.d, identity.data(), identity.data(), twice.data(), c.d, c.limit, rwp,
                                 saved, dy.data(), dx.data(), dw1.data(), dw2.data(), dw3.data(),
                                 c.weighted ? drw.data() : nullptr);
    if (c.limit > 0) {
      size_t g_clamped = 0, u_clamped = 0;
      for (size_t e = 0; e < n; ++e) g_clamped += saved.gate[e] > c.limit, u_clamped += std::fabs(saved.up[e]) > c.limit;
      ASSERT_GT(g_clamped, 0u) << "no gate value past the limit: the data do not exercise the clamp";
      ASSERT_GT(u_clamped, 0u) << "no up value past the limit: the data do not exercise the clamp";
    }

    std::vector<float> up(n);
    for (size_t e = 0; e < n; ++e) up[e] = 2.0f * x[e];
    DeviceArray<float> dgate(x), dup_in(up), drw_w(rw), ddy(dy);
    auto run = [&](std::vector<float>& h, std::vector<float>& dg, std::vector<float>& du, std::vector<float>& dr) {
      DeviceArray<float> hidden(n), g_grad(n), u_grad(n), rgrad(drw0);
      hidden.poison(), g_grad.poison(), u_grad.poison();
      const float* w = c.weighted ? drw_w.get() : nullptr;
      train_cuda::swiglu_forward(dgate.get(), dup_in.get(), c.rows, c.d, c.limit, w, hidden.get());
      train_cuda::swiglu_backward(dgate.get(), dup_in.get(), c.rows, c.d, c.limit, w, ddy.get(), g_grad.get(), u_grad.get(),
                                  c.weighted ? rgrad.get() : nullptr);
      h = hidden.download(), dg = g_grad.download(), du = u_grad.download(), dr = rgrad.download();
    };
    std::vector<float> h, dg, du, dr;
    run(h, dg, du, dr);
    std::vector<float> got_dx(n);
    for (size_t e = 0; e < n; ++e) got_dx[e] = (0.0f + dg[e]) + 2.0f * du[e];  // the CPU's two products' sums
    const double eh = test::nmse(h, saved.hidden), edx = test::nmse(got_dx, dx);
    const double er = c.weighted ? test::nmse(dr, drw) : 0.0;
    std::printf("swiglu %ldx%ld limit %g: NMSE h %.3g dx %.3g drow %.3g\n", long(c.rows), long(c.d), double(c.limit), eh, edx, er);
    EXPECT_LT(eh, 1e-11);
    EXPECT_LT(edx, 1e-11);
    EXPECT_LT(er, 1e-10);
    std::vector<float> h2, dg2, du2, dr2;
    run(h2, dg2, du2, dr2);
    EXPECT_TRUE(test::same_bits(h, h2) && test::same_bits(dg, dg2) && test::same_bits(du, du2) && test::same_bits(dr, dr2))
        << "two runs differ";
  }
}

// The expert on the device: products on bf16 casts (linear.h), the activation in fp32.
struct ExpertGrads {
  std::vector<float> y, dx, dw1, dw2, dw3, drw;
};

ExpertGrads expert_on_device(train_cuda::Blas& blas, int64_t rows, int64_t dim, int64_t inter, const std::vector<float>& x,
                             const std::vector<float>& w1, const std::vector<float>& w2, const std::vector<float>& w3,
                             const std::vector<float>& rw, const std::vector<float>& dy) {
  using train_cuda::cast_bf16;
  const int64_t nx = rows * dim, nh = rows * inter;
  const size_t xn = size_t(nx), hn = size_t(nh);
  DeviceArray<float> x32(x), w1_32(w1), w2_32(w2), w3_32(w3), rw_d(rw), dy32(dy);
  DeviceArray<uint16_t> xb(x.size()), w1b(w1.size()), w2b(w2.size()), w3b(w3.size()), hb(hn), dyb(dy.size());
  DeviceArray<uint16_t> dgb(hn), dub(hn);
  DeviceArray<float> gate(hn), up(hn), hidden(hn), y(xn);
  DeviceArray<float> dh(std::vector<float>(hn, 0.0f)), dg(hn), du(hn);
  DeviceArray<float> dx(std::vector<float>(xn, 0.0f)), dw1(std::vector<float>(w1.size(), 0.0f));
  DeviceArray<float> dw2(std::vector<float>(w2.size(), 0.0f)), dw3(std::vector<float>(w3.size(), 0.0f));
  DeviceArray<float> drw(std::vector<float>(rw.size(), 0.0f));
  cast_bf16(x32.get(), nx, xb.get());
  cast_bf16(w1_32.get(), int64_t(w1.size()), w1b.get());
  cast_bf16(w2_32.get(), int64_t(w2.size()), w2b.get());
  cast_bf16(w3_32.get(), int64_t(w3.size()), w3b.get());
  // Forward.
  train_cuda::linear_forward(blas, train_cuda::Operands::Bf16, xb.get(), rows, dim, w1b.get(), inter, gate.get());
  train_cuda::linear_forward(blas, train_cuda::Operands::Bf16, xb.get(), rows, dim, w3b.get(), inter, up.get());
  train_cuda::swiglu_forward(gate.get(), up.get(), rows, inter, kLimit, rw_d.get(), hidden.get());
  cast_bf16(hidden.get(), nh, hb.get());
  train_cuda::linear_forward(blas, train_cuda::Operands::Bf16, hb.get(), rows, inter, w2b.get(), dim, y.get());
  // Backward.
  cast_bf16(dy32.get(), nx, dyb.get());
  train_cuda::linear_backward(blas, train_cuda::Operands::Bf16, hb.get(), rows, inter, w2b.get(), dim, dyb.get(),
                              dh.get(), dw2.get());
  train_cuda::swiglu_backward(gate.get(), up.get(), rows, inter, kLimit, rw_d.get(), dh.get(), dg.get(), du.get(), drw.get());
  cast_bf16(dg.get(), nh, dgb.get());
  cast_bf16(du.get(), nh, dub.get());
  train_cuda::linear_backward(blas, train_cuda::Operands::Bf16, xb.get(), rows, dim, w1b.get(), inter, dgb.get(),
                              dx.get(), dw1.get());
  train_cuda::linear_backward(blas, train_cuda::Operands::Bf16, xb.get(), rows, dim, w3b.get(), inter, dub.get(),
                              dx.get(), dw3.get());
  return {y.download(), dx.download(), dw1.download(), dw2.download(), dw3.download(), drw.download()};
}

TEST(TrainCudaSwiglu, ExpertOnBf16ProductsWithinTheCastsBound) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  const double bound = 16 * test::kBf16Unit * test::kBf16Unit;
  struct Case {
    int64_t rows, dim, inter;
  };
  uint32_t seed = 100;
  for (const Case c : {Case{64, 1024, 512}, Case{7, 100, 37}, Case{1, 256, 96}}) {
    const std::vector<float> x = test::normal(size_t(c.rows * c.dim), 1.0, seed++);
    const std::vector<float> w1 = test::normal(size_t(c.inter * c.dim), 1.0 / std::sqrt(double(c.dim)), seed++);
    const std::vector<float> w3 = test::normal(size_t(c.inter * c.dim), 1.0 / std::sqrt(double(c.dim)), seed++);
    const std::vector<float> w2 = test::normal(size_t(c.dim * c.inter), 1.0 / std::sqrt(double(c.inter)), seed++);
    const std::vector<float> rw = uniform(size_t(c.rows), 0.2, 1.0, seed++);
    const std::vector<float> dy = test::normal(size_t(c.rows * c.dim), 1.0, seed++);

    grad::ExpertSaved<float> saved;
    ExpertGrads want{std::vector<float>(x.size()), std::vector<float>(x.size(), 0.0f), std::vector<float>(w1.size(), 0.0f),
                     std::vector<float>(w2.size(), 0.0f), std::vector<float>(w3.size(), 0.0f),
                     std::vector<float>(rw.size(), 0.0f)};
    grad::expert_forward<float>(x.data(), c.rows, c.dim, w1.data(), w2.data(), w3.data(), c.inter, kLimit, rw.data(),
                                want.y.data(), saved);
    for (size_t e = 0; e < saved.gate.size(); ++e)
      ASSERT_LT(std::max(std::fabs(saved.gate[e]), std::fabs(saved.up[e])), kLimit - 1.0f)
          << "the data must keep every g and u a margin inside the clamps";
    grad::expert_backward<float>(x.data(), c.rows, c.dim, w1.data(), w2.data(), w3.data(), c.inter, kLimit, rw.data(), saved,
                                 dy.data(), want.dx.data(), want.dw1.data(), want.dw2.data(), want.dw3.data(),
                                 want.drw.data());

    const ExpertGrads got = expert_on_device(blas, c.rows, c.dim, c.inter, x, w1, w2, w3, rw, dy);
    const double e[6] = {test::nmse(got.y, want.y),     test::nmse(got.dx, want.dx),   test::nmse(got.dw1, want.dw1),
                         test::nmse(got.dw2, want.dw2), test::nmse(got.dw3, want.dw3), test::nmse(got.drw, want.drw)};
    std::printf("expert %ldx%ld→%ld: NMSE y %.3g dx %.3g dw1 %.3g dw2 %.3g dw3 %.3g drow %.3g (bound %.3g)\n", long(c.rows),
                long(c.dim), long(c.inter), e[0], e[1], e[2], e[3], e[4], e[5], bound);
    for (const double v : e) EXPECT_LT(v, bound) << c.rows << "x" << c.dim << "x" << c.inter;

    const ExpertGrads again = expert_on_device(blas, c.rows, c.dim, c.inter, x, w1, w2, w3, rw, dy);
    EXPECT_TRUE(test::same_bits(got.y, again.y) && test::same_bits(got.dx, again.dx) && test::same_bits(got.dw1, again.dw1) &&
                test::same_bits(got.dw2, again.dw2) && test::same_bits(got.dw3, again.dw3) &&
                test::same_bits(got.drw, again.drw))
        << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
