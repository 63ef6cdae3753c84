// cuda::route and cuda::expert_ffn against the CPU MoE ops (backend/cpu/moe.h) on the same random
// inputs: V4.1-Flash's gate (384 experts × 5120, top-6, sqrt-softplus, route_scale 1.5) and expert
// (2304 × 5120 fp4, SwiGLU limit 10), and small shapes (sigmoid, no normalization, fp8, bf16).
//
// Tolerances. Routing: the logits are fp32 products summed in another order (relative ~1e-7), and
// expf/log1pf may differ in the last bit, so an expert whose biased score is within ~1e-5 of the
// next one's may swap places with it; any other difference is a bug (a wrong score or bias gives
// gaps of 1e-2 and more). The test accepts a differing choice only at such a near-tie (1e-4
// absolute on scores of order 1) and counts them. The weights of identically routed rows: NMSE
// ~ (1e-7)², bound 1e-10.
// Expert: each linear matches the CPU's (ops_linear_test); the SwiGLU's expf may differ in the last
// bit, which changes a hidden value's bf16 rounding rarely (~1e-5 of them), and such a change
// moves w2's act-quantized input by at most one e4m3 step (2^-3 relative) of one of K = 2304 terms:
// NMSE ≈ 2^-6 / 2304 ≈ 7e-6 for a row with one such flip. Bound 1e-4: a few flips in a one-row
// case; a wrong clamp, gate or weight gives NMSE > 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/moe.h"
#include "backend/cuda/moe.h"
#include "device_util.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

// A host weight's bytes on the device, and the Weight over them.
struct DeviceWeight {
  DeviceArray<uint8_t> data, scale;
  Weight w;
  explicit DeviceWeight(const test::OwnedWeight& o)
      : data(o.data), scale(o.scale.empty() ? std::vector<uint8_t>{0} : o.scale), w(o.view()) {
    w.data = data.get();
    w.scale = o.scale.empty() ? nullptr : scale.get();
  }
};

struct RouteCase {
  int rows, experts, dim, k;
  const char* func;
  bool norm;
  float temp, scale;
};

TEST(CudaMoe, RoutingMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 40;
  for (const RouteCase& c : {RouteCase{1, 384, 5120, 6, "sqrtsoftplus", true, 1.0f, 1.5f},
                             RouteCase{33, 384, 5120, 6, "sqrtsoftplus", true, 1.0f, 1.5f},
                             RouteCase{7, 8, 128, 2, "sigmoid", false, 1.3f, 1.0f},
                             RouteCase{5, 16, 256, 3, "sqrtsoftplus", true, 1.0f, 2.5f}}) {
    const std::vector<float> x = test::bf16_normal(size_t(c.rows) * c.dim, 1.0, seed += 3);
    const test::OwnedWeight gate =
        test::make_weight(WeightFormat::BF16, test::bf16_normal(size_t(c.experts) * c.dim, 0.02, seed + 1), c.experts, c.dim);
    const std::vector<float> bias = test::bf16_normal(size_t(c.experts), 0.1, seed + 2);
    GateOptions opt;
    opt.topk = c.k, opt.score_func = c.func, opt.gate_temp = c.temp, opt.norm_topk_prob = c.norm, opt.route_scale = c.scale;
    std::vector<int32_t> want_e(size_t(c.rows) * c.k);
    std::vector<float> want_w(want_e.size()), biased(size_t(c.rows) * c.experts);
    route(x.data(), c.rows, gate.view(), test::f32_view(bias, 1, c.experts), opt, want_e.data(), want_w.data(),
          biased.data());

    DeviceWeight dgate(gate);
    DeviceArray<float> dx(x), dbias(bias), dweights(want_w.size());
    DeviceArray<int32_t> dexperts(want_e.size());
    dweights.poison();
    dexperts.poison();
    Weight bias_w = test::f32_view(bias, 1, c.experts);
    bias_w.data = reinterpret_cast<const uint8_t*>(dbias.get());
    cuda::route(dx.get(), c.rows, dgate.w, bias_w, opt, dexperts.get(), dweights.get());
    const std::vector<int32_t> got_e = dexperts.download();
    const std::vector<float> got_w = dweights.download();

    int near_ties = 0, wrong = 0;
    std::vector<float> gw, ww;
    for (int r = 0; r < c.rows; ++r) {
      bool same = true;
      for (int j = 0; j < c.k; ++j) {
        const int32_t g = got_e[size_t(r) * c.k + j], w = want_e[size_t(r) * c.k + j];
        if (g == w) continue;
        same = false;
        const bool valid = g >= 0 && g < c.experts;
        if (valid && std::fabs(biased[size_t(r) * c.experts + g] - biased[size_t(r) * c.experts + w]) <= 1e-4) ++near_ties;
        else ++wrong;
      }
      if (same)
        for (int j = 0; j < c.k; ++j) gw.push_back(got_w[size_t(r) * c.k + j]), ww.push_back(want_w[size_t(r) * c.k + j]);
    }
    const double e = test::nmse(gw, ww);
    std::printf("route %s E=%d k=%d rows=%d: %d near-tie swaps, %d wrong, weights NMSE %.3g over %zu rows\n", c.func,
                c.experts, c.k, c.rows, near_ties, wrong, e, gw.size() / size_t(c.k));
    EXPECT_EQ(wrong, 0);
    EXPECT_LE(near_ties, 2);
    EXPECT_LT(e, 1e-10);
  }
}

struct ExpertCase {
  const char* name;
  WeightFormat format;
  int rows, dim, inter;
  float limit;
  bool weighted;
};

TEST(CudaMoe, ExpertMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 90;
  for (const ExpertCase& c : {ExpertCase{"V4.1 routed", WeightFormat::FP4, 1, 5120, 2304, 10.0f, true},
                              ExpertCase{"V4.1 routed", WeightFormat::FP4, 11, 5120, 2304, 10.0f, true},
                              ExpertCase{"V4.1 shared", WeightFormat::FP4, 3, 5120, 2304, 10.0f, false},
                              ExpertCase{"small fp8 no limit", WeightFormat::FP8, 5, 256, 96, 0.0f, true},
                              ExpertCase{"small bf16", WeightFormat::BF16, 2, 128, 64, 10.0f, false}}) {
    const std::vector<float> x = test::bf16_normal(size_t(c.rows) * c.dim, 1.0, seed += 5);
    const test::OwnedWeight w1 = test::make_weight(c.format, test::bf16_normal(size_t(c.inter) * c.dim, 0.05, seed + 1), c.inter, c.dim);
    const test::OwnedWeight w3 = test::make_weight(c.format, test::bf16_normal(size_t(c.inter) * c.dim, 0.05, seed + 2), c.inter, c.dim);
    const test::OwnedWeight w2 = test::make_weight(c.format, test::bf16_normal(size_t(c.dim) * c.inter, 0.05, seed + 3), c.dim, c.inter);
    const std::vector<float> rw = test::bf16_uniform(size_t(c.rows), 0.05, 0.6, seed + 4);
    std::vector<float> want(size_t(c.rows) * c.dim);
    expert_ffn(x.data(), c.rows, w1.view(), w2.view(), w3.view(), c.limit, c.weighted ? rw.data() : nullptr, want.data());

    DeviceWeight d1(w1), d2(w2), d3(w3);
    DeviceArray<float> dx(x), drw(rw), dy(want.size());
    dy.poison();
    cuda::expert_ffn(dx.get(), c.rows, d1.w, d2.w, d3.w, c.limit, c.weighted ? drw.get() : nullptr, dy.get());
    const double e = test::nmse(dy.download(), want);
    std::printf("expert_ffn %-18s %s rows=%d %dx%d NMSE %.3g\n", c.name, test::format_name(c.format), c.rows, c.inter,
                c.dim, e);
    EXPECT_LT(e, 1e-4) << c.name;
  }
}

}  // namespace
}  // namespace dsv41
