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
//
// The sub-layer (cuda::moe) against forward.cpp's moe() written here from the CPU ops: V4.1-like
// shapes (E = 384 and 16 experts, top-6, dim 4096, inter 2048, fp4 experts, fp8 or fp4 shared
// expert, rows 1, 8, 64, 80, 300), small odd shapes (fp8 and bf16 experts, sigmoid), and forced
// experts (with an expert repeated within a row). The routing is checked as above (near-ties
// counted, at most 2 per case); the CPU sub-layer then runs on the experts the GPU chose (forced),
// so a near-tie swap does not hide the rest of the comparison. Its tolerance is the expert's: the
// routed experts and the shared one are each the expert_ffn above (rare bf16 flips of a hidden
// value from the fp32 sum order or expf's last bit, NMSE ~1e-6 per affected row), added in the
// CPU's order in fp32, so NMSE ≤ 1e-4; a wrong expert, weight, clamp or a missing row gives > 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
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

// ---- the sub-layer -------------------------------------------------------------------------------

// Experts' w1, w2, w3 on the host and on the device (views of one set of buffers each side).
struct ExpertSet {
  int experts = 0;
  WeightFormat format = WeightFormat::FP4;
  std::vector<Weight> h1, h2, h3, d1, d2, d3;  // host, device
  std::vector<std::vector<uint8_t>> host;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> device;

  const uint8_t* keep(std::vector<uint8_t> bytes, const uint8_t** on_device) {
    device.push_back(std::make_unique<DeviceArray<uint8_t>>(bytes));
    *on_device = device.back()->get();
    host.push_back(std::move(bytes));
    return host.back().data();
  }
};

// The V4.1 shapes at 384 experts would take 4.8 GB: instead each matrix kind has one pool of random
// codes (fp4 any byte; fp8 exponent ≤ 7, so values ≤ 1.875 and no NaN) and random ue8m0 scales
// (fp4 2^-9..2^-6, fp8 2^-6..2^-4: w·x of order 1), and expert e's matrix starts e·1552 bytes (e·20
// scales) into it: distinct windows, not at row boundaries, so a wrong expert's output is unrelated
// (16- and 4-byte aligned, as the tensor-core path reads codes and scales; ExpertTable::aligned).
ExpertSet pooled_experts(WeightFormat f, int E, int dim, int inter, uint32_t seed) {
  ExpertSet s;
  s.experts = E, s.format = f;
  std::mt19937 rng(seed);
  auto make = [&](int rows, int cols, std::vector<Weight>& hv, std::vector<Weight>& dv) {
    const bool fp4 = f == WeightFormat::FP4;
    const size_t bytes = fp4 ? size_t(rows) * cols / 2 : size_t(rows) * cols;
    const size_t scales = fp4 ? size_t(rows) * (cols / 32) : size_t((rows + 31) / 32) * ((cols + 31) / 32);
    const size_t shift = 1552, sshift = 20;
    std::vector<uint8_t> data(bytes + size_t(E - 1) * shift), scale(scales + size_t(E - 1) * sshift);
    for (uint8_t& b : data) b = uint8_t(fp4 ? rng() : rng() & 0xBF);
    for (uint8_t& b : scale) b = uint8_t(fp4 ? 118 + rng() % 4 : 121 + rng() % 3);
    const uint8_t *dd = nullptr, *ds = nullptr;
    const uint8_t* hd = s.keep(std::move(data), &dd);
    const uint8_t* hs = s.keep(std::move(scale), &ds);
    for (int e = 0; e < E; ++e) {
      hv.push_back(Weight{f, rows, cols, hd + e * shift, hs + e * sshift});
      dv.push_back(Weight{f, rows, cols, dd + e * shift, ds + e * sshift});
    }
  };
  make(inter, dim, s.h1, s.d1);
  make(dim, inter, s.h2, s.d2);
  make(inter, dim, s.h3, s.d3);
  return s;
}

// Small shapes: each expert's weights made by the codecs from bf16 N(0, 0.05) values.
ExpertSet made_experts(WeightFormat f, int E, int dim, int inter, uint32_t seed) {
  ExpertSet s;
  s.experts = E, s.format = f;
  auto add = [&](int rows, int cols, uint32_t sd, std::vector<Weight>& hv, std::vector<Weight>& dv) {
    const test::OwnedWeight o = test::make_weight(f, test::bf16_normal(size_t(rows) * cols, 0.05, sd), rows, cols);
    const uint8_t *dd = nullptr, *ds = nullptr;
    const uint8_t* hd = s.keep(o.data, &dd);
    const uint8_t* hs = o.scale.empty() ? nullptr : s.keep(o.scale, &ds);
    hv.push_back(Weight{f, rows, cols, hd, hs});
    dv.push_back(Weight{f, rows, cols, dd, ds});
  };
  for (int e = 0; e < E; ++e) {
    add(inter, dim, seed + 3 * e, s.h1, s.d1);
    add(dim, inter, seed + 3 * e + 1, s.h2, s.d2);
    add(inter, dim, seed + 3 * e + 2, s.h3, s.d3);
  }
  return s;
}

// forward.cpp's moe() after the routing, from the CPU ops: each expert on its rows (ascending row,
// then slot) with their weights, added into y from 0.0f in ascending expert id, in fp32; then the
// shared expert; then bf16.
std::vector<float> cpu_moe(const std::vector<float>& x, int64_t R, int64_t d, int k, const std::vector<int32_t>& experts,
                           const std::vector<float>& weights, const ExpertSet& routed, const ExpertSet& shared,
                           float limit) {
  std::vector<float> y(size_t(R * d), 0.0f), xe, ye, we;
  std::vector<int64_t> rows_of;
  for (int e = 0; e < routed.experts; ++e) {
    rows_of.clear();
    we.clear();
    for (int64_t r = 0; r < R; ++r)
      for (int j = 0; j < k; ++j)
        if (experts[size_t(r * k + j)] == e) rows_of.push_back(r), we.push_back(weights[size_t(r * k + j)]);
    if (rows_of.empty()) continue;
    const int64_t n = int64_t(rows_of.size());
    xe.resize(size_t(n * d));
    ye.resize(size_t(n * d));
    for (int64_t i = 0; i < n; ++i) std::copy_n(x.data() + rows_of[size_t(i)] * d, d, xe.data() + i * d);
    expert_ffn(xe.data(), n, routed.h1[size_t(e)], routed.h2[size_t(e)], routed.h3[size_t(e)], limit, we.data(),
               ye.data());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < d; ++j) y[size_t(rows_of[size_t(i)] * d + j)] += ye[size_t(i * d + j)];
  }
  ye.resize(size_t(R * d));
  expert_ffn(x.data(), R, shared.h1[0], shared.h2[0], shared.h3[0], limit, nullptr, ye.data());
  std::vector<float> out(size_t(R * d));
  for (size_t i = 0; i < out.size(); ++i) out[i] = round_bf16(y[i] + ye[i]);
  return out;
}

struct MoeCase {
  const char* name;
  int experts, k, rows, dim, inter, inter_s;
  WeightFormat routed, shared;
  bool pooled;
  const char* func;
  bool norm;
  float temp, scale, limit;
  bool forced;
};

TEST(CudaMoe, SubLayerMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  const WeightFormat fp4 = WeightFormat::FP4, fp8 = WeightFormat::FP8, bf16 = WeightFormat::BF16;
  uint32_t seed = 700;
  for (const MoeCase& c : {
           MoeCase{"V4.1 E=384", 384, 6, 1, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 1.5f, 10.0f, false},
           MoeCase{"V4.1 E=384", 384, 6, 8, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 1.5f, 10.0f, false},
           MoeCase{"V4.1 E=384", 384, 6, 64, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 1.5f, 10.0f, false},
           MoeCase{"V4.1 E=384", 384, 6, 300, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 1.5f, 10.0f, false},
           MoeCase{"E=16", 16, 6, 1, 4096, 2048, 2048, fp4, fp4, true, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, false},
           MoeCase{"E=16", 16, 6, 64, 4096, 2048, 2048, fp4, fp4, true, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, false},
           MoeCase{"E=16", 16, 6, 80, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, false},
           MoeCase{"E=16", 16, 6, 300, 4096, 2048, 2048, fp4, fp4, true, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, false},
           MoeCase{"E=16", 16, 6, 700, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, false},
           MoeCase{"fp8 E=8", 8, 2, 100, 256, 384, 128, fp8, fp8, false, "sigmoid", false, 1.3f, 1.0f, 2.0f, false},
           MoeCase{"forced E=384", 384, 6, 8, 4096, 2048, 2048, fp4, fp8, true, "sqrtsoftplus", true, 1.0f, 1.5f, 10.0f, true},
           MoeCase{"forced E=16", 16, 6, 64, 4096, 2048, 2048, fp4, fp4, true, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, true},
           MoeCase{"forced E=4", 4, 3, 200, 256, 128, 128, fp4, fp4, false, "sqrtsoftplus", true, 1.0f, 2.5f, 3.0f, true},
           MoeCase{"small fp8 sigmoid", 7, 3, 13, 160, 96, 64, fp8, bf16, false, "sigmoid", false, 1.3f, 1.0f, 2.0f, false},
           MoeCase{"small fp8 forced", 7, 3, 1, 160, 96, 64, fp8, bf16, false, "sigmoid", false, 1.3f, 1.0f, 2.0f, true},
           MoeCase{"small fp8 one row", 7, 3, 1, 160, 96, 64, fp8, fp8, false, "sigmoid", false, 1.3f, 1.0f, 2.0f, false},
           MoeCase{"small bf16", 5, 2, 6, 64, 40, 64, bf16, fp4, false, "sqrtsoftplus", true, 1.0f, 1.0f, 0.0f, false},
       }) {
    seed += 17;
    const ExpertSet routed = c.pooled ? pooled_experts(c.routed, c.experts, c.dim, c.inter, seed)
                                      : made_experts(c.routed, c.experts, c.dim, c.inter, seed);
    const ExpertSet shared = c.pooled ? pooled_experts(c.shared, 1, c.dim, c.inter_s, seed + 1)
                                      : made_experts(c.shared, 1, c.dim, c.inter_s, seed + 1);
    const std::vector<float> x = test::bf16_normal(size_t(c.rows) * c.dim, 1.0, seed + 2);
    const test::OwnedWeight gate = test::make_weight(
        WeightFormat::BF16, test::bf16_normal(size_t(c.experts) * c.dim, 1.28 / std::sqrt(double(c.dim)), seed + 3),
        c.experts, c.dim);
    const std::vector<float> bias = test::bf16_normal(size_t(c.experts), 0.1, seed + 4);
    GateOptions opt;
    opt.topk = c.k, opt.score_func = c.func, opt.gate_temp = c.temp, opt.norm_topk_prob = c.norm, opt.route_scale = c.scale;
    const size_t nk = size_t(c.rows) * c.k;

    // Forced: random experts, row 0 (and every fifth) naming one expert twice.
    std::vector<int32_t> forced(nk);
    std::mt19937 rng(seed + 5);
    for (size_t i = 0; i < nk; ++i) forced[i] = int32_t(rng() % uint32_t(c.experts));
    for (int r = 0; r < c.rows; r += 5) forced[size_t(r) * c.k + c.k - 1] = forced[size_t(r) * c.k];

    std::vector<int32_t> want_e(nk);
    std::vector<float> want_w(nk), biased(size_t(c.rows) * c.experts);
    route(x.data(), c.rows, gate.view(), test::f32_view(bias, 1, c.experts), opt, want_e.data(), want_w.data(),
          biased.data());

    DeviceWeight dgate(gate);
    DeviceArray<float> dx(x), dbias(bias), dweights(nk), dy(size_t(c.rows) * c.dim);
    DeviceArray<int32_t> dexperts(nk), dforced(forced);
    Weight bias_w = test::f32_view(bias, 1, c.experts);
    bias_w.data = reinterpret_cast<const uint8_t*>(dbias.get());
    const cuda::ExpertTable table(routed.d1, routed.d2, routed.d3);
    // Both expert paths where the tensor cores take the shapes (fp8/fp4, multiples of 128).
    std::vector<cuda::MoePath> paths{cuda::MoePath::gemv};
    if (c.routed != bf16 && c.dim % 128 == 0 && c.inter % 128 == 0) paths.push_back(cuda::MoePath::tensor_cores);
    for (const cuda::MoePath path : paths) {
      const char* path_name = path == cuda::MoePath::gemv ? "gemv" : "tensor cores";
      dweights.poison(), dexperts.poison(), dy.poison();
      cuda::moe(dx.get(), c.rows, dgate.w, bias_w, opt, table, shared.d1[0], shared.d2[0], shared.d3[0], c.limit,
                c.forced ? dforced.get() : nullptr, dexperts.get(), dweights.get(), dy.get(), nullptr, path);
      const std::vector<int32_t> got_e = dexperts.download();
      const std::vector<float> got_w = dweights.download(), got_y = dy.download();

      // The routing: the forced experts exactly, or the CPU's choice up to near-ties.
      int near_ties = 0, wrong = 0;
      for (int r = 0; r < c.rows; ++r)
        for (int j = 0; j < c.k; ++j) {
          const size_t i = size_t(r) * c.k + j;
          const int32_t g = got_e[i], w = c.forced ? forced[i] : want_e[i];
          if (g == w) continue;
          const bool valid = !c.forced && g >= 0 && g < c.experts;
          if (valid && std::fabs(biased[size_t(r) * c.experts + g] - biased[size_t(r) * c.experts + w]) <= 1e-4) ++near_ties;
          else ++wrong;
        }
      EXPECT_EQ(wrong, 0) << c.name << " rows=" << c.rows << " " << path_name;
      EXPECT_LE(near_ties, 2) << c.name << " rows=" << c.rows << " " << path_name;
      if (wrong > 0) continue;

      // The CPU sub-layer on the GPU's experts: their CPU weights, then the experts and the sum.
      std::vector<int32_t> ref_e(nk);
      std::vector<float> ref_w(nk);
      route(x.data(), c.rows, gate.view(), test::f32_view(bias, 1, c.experts), opt, ref_e.data(), ref_w.data(), nullptr,
            got_e.data());
      const std::vector<float> want_y = cpu_moe(x, c.rows, c.dim, c.k, ref_e, ref_w, routed, shared, c.limit);
      const double ew = test::nmse(got_w, ref_w), ey = test::nmse(got_y, want_y);
      size_t same = 0;
      for (size_t i = 0; i < got_y.size(); ++i) same += got_y[i] == want_y[i];
      std::printf("moe %-18s E=%d k=%d rows=%d %dx%d %s/%s %s: %d near-tie swaps, weights NMSE %.3g, y NMSE %.3g, "
                  "%.4f of y bit-equal\n",
                  c.name, c.experts, c.k, c.rows, c.inter, c.dim, test::format_name(c.routed),
                  test::format_name(c.shared), path_name, near_ties, ew, ey, double(same) / double(got_y.size()));
      EXPECT_LT(ew, 1e-10) << c.name << " rows=" << c.rows << " " << path_name;
      EXPECT_LT(ey, 1e-4) << c.name << " rows=" << c.rows << " " << path_name;
    }
  }
}

// Random bytes (h & mask) + base on the device, h a hash of the position and the seed.
__global__ void fill_codes(uint8_t* p, size_t n, uint32_t seed, uint8_t mask, uint8_t base) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(seed) << 40 ^ i) + 0x9E3779B97F4A7C15ull;  // splitmix64
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    p[i] = uint8_t((uint8_t(h ^ (h >> 31)) & mask) + base);
  }
}

// cuda::moe at V4.1-Flash decode shapes (384 distinct fp4 experts of 2048 x 4096, 4.8 GB; fp8
// shared expert) captured in a CUDA graph: capture succeeds (no host synchronization inside), the
// replay gives the direct calls' outputs bit for bit, and the graph's kernel count and time per
// call are printed (16 calls on 16 inputs, so each reads other experts' weights from HBM; the
// floor is the bytes read over ~4.8 TB/s).
TEST(CudaMoe, SubLayerCapturesInGraph) {
  DSV41_REQUIRE_DEVICE();
  const int E = 384, k = 6, dim = 4096, inter = 2048, calls = 16;
  const size_t wbytes = size_t(inter) * dim / 2, sbytes = size_t(inter) * dim / 32;  // one fp4 matrix
  DeviceArray<uint8_t> wdata(3 * E * wbytes), wscale(3 * E * sbytes);
  fill_codes<<<4096, 256>>>(wdata.get(), wdata.bytes(), 1, 0xFF, 0);
  fill_codes<<<1024, 256>>>(wscale.get(), wscale.bytes(), 2, 0x3, 118);
  std::vector<Weight> w1, w2, w3;
  for (int e = 0; e < E; ++e)
    for (int m = 0; m < 3; ++m) {
      const size_t i = size_t(3 * e + m);
      const Weight w{WeightFormat::FP4, m == 1 ? dim : inter, m == 1 ? inter : dim, wdata.get() + i * wbytes,
                     wscale.get() + i * sbytes};
      (m == 0 ? w1 : m == 1 ? w2 : w3).push_back(w);
    }
  const size_t s8 = size_t(inter) * dim, s8scales = size_t(inter / 32) * (dim / 32);
  DeviceArray<uint8_t> sdata(3 * s8), sscale(3 * s8scales);
  fill_codes<<<1024, 256>>>(sdata.get(), sdata.bytes(), 3, 0xBF, 0);
  fill_codes<<<64, 256>>>(sscale.get(), sscale.bytes(), 4, 0x3, 121);
  const Weight s1{WeightFormat::FP8, inter, dim, sdata.get(), sscale.get()};
  const Weight s2{WeightFormat::FP8, dim, inter, sdata.get() + s8, sscale.get() + s8scales};
  const Weight s3{WeightFormat::FP8, inter, dim, sdata.get() + 2 * s8, sscale.get() + 2 * s8scales};
  cuda::check(cudaDeviceSynchronize(), "fill");  // the calls below run on another stream

  cudaStream_t stream;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");

  // The first E of the experts (384: V4.1-Flash; 16: bench-1gpu), at decode batches, each path.
  using cuda::MoePath;
  struct Run {
    int E, rows;
    MoePath path;
  };
  for (const Run run : {Run{384, 1, MoePath::gemv}, Run{384, 8, MoePath::gemv}, Run{384, 64, MoePath::gemv},
                        Run{384, 64, MoePath::tensor_cores}, Run{16, 1, MoePath::gemv}, Run{16, 1, MoePath::tensor_cores},
                        Run{16, 8, MoePath::gemv}, Run{16, 8, MoePath::tensor_cores}, Run{16, 16, MoePath::gemv},
                        Run{16, 16, MoePath::tensor_cores}, Run{16, 64, MoePath::gemv}, Run{16, 64, MoePath::tensor_cores}}) {
    const int E = run.E, rows = run.rows;
    const char* path_name = run.path == MoePath::gemv ? "gemv" : "tensor cores";
    const test::OwnedWeight gate =
        test::make_weight(WeightFormat::BF16, test::bf16_normal(size_t(E) * dim, 0.02, 31), E, dim);
    DeviceWeight dgate(gate);
    const std::vector<float> bias = test::bf16_normal(size_t(E), 0.1, 32);
    DeviceArray<float> dbias(bias);
    Weight bias_w = test::f32_view(bias, 1, E);
    bias_w.data = reinterpret_cast<const uint8_t*>(dbias.get());
    GateOptions opt;
    opt.topk = k, opt.route_scale = 1.5f;
    const cuda::ExpertTable table(std::vector<Weight>(w1.begin(), w1.begin() + E), std::vector<Weight>(w2.begin(), w2.begin() + E),
                                  std::vector<Weight>(w3.begin(), w3.begin() + E));
    const size_t n = size_t(rows) * dim, nk = size_t(rows) * k;
    DeviceArray<float> x(test::bf16_normal(calls * n, 1.0, 40 + rows));
    DeviceArray<float> y_direct(calls * n), y_graph(calls * n), weights(calls * nk);
    DeviceArray<int32_t> e_direct(calls * nk), e_graph(calls * nk);
    // The uploads above are on the legacy stream, and a copy from pageable memory may still be on
    // its way when cudaMemcpy returns: the calls below run on another stream.
    cuda::check(cudaDeviceSynchronize(), "upload");
    auto call = [&](int i, float* y, int32_t* experts) {
      cuda::moe(x.get() + i * n, rows, dgate.w, bias_w, opt, table, s1, s2, s3, 10.0f, nullptr, experts + i * nk,
                weights.get() + i * nk, y + i * n, stream, run.path);
    };
    for (int i = 0; i < calls; ++i) call(i, y_direct.get(), e_direct.get());
    cuda::check(cudaStreamSynchronize(stream), "direct");

    cudaGraph_t one, graph;
    cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    call(0, y_graph.get(), e_graph.get());
    cuda::check(cudaStreamEndCapture(stream, &one), "capture");
    size_t count = 0;
    cuda::check(cudaGraphGetNodes(one, nullptr, &count), "nodes");
    std::vector<cudaGraphNode_t> nodes(count);
    cuda::check(cudaGraphGetNodes(one, nodes.data(), &count), "nodes");
    int kernels = 0;
    for (size_t i = 0; i < count; ++i) {
      cudaGraphNodeType type;
      cuda::check(cudaGraphNodeGetType(nodes[i], &type), "node type");
      kernels += type == cudaGraphNodeTypeKernel;
    }
    cudaGraphDestroy(one);

    cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    for (int i = 0; i < calls; ++i) call(i, y_graph.get(), e_graph.get());
    cuda::check(cudaStreamEndCapture(stream, &graph), "capture");
    cudaGraphExec_t exec;
    cuda::check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    y_graph.poison(), e_graph.poison();
    cuda::check(cudaDeviceSynchronize(), "poison");
    cuda::check(cudaGraphLaunch(exec, stream), "replay");
    cuda::check(cudaStreamSynchronize(stream), "replay");
    EXPECT_EQ(y_graph.download(), y_direct.download()) << "E=" << E << " rows=" << rows << " " << path_name;
    EXPECT_EQ(e_graph.download(), e_direct.download()) << "E=" << E << " rows=" << rows << " " << path_name;

    cudaEvent_t start, stop;
    cuda::check(cudaEventCreate(&start), "event"), cuda::check(cudaEventCreate(&stop), "event");
    const int replays = 20;
    cuda::check(cudaEventRecord(start, stream), "event");
    for (int r = 0; r < replays; ++r) cuda::check(cudaGraphLaunch(exec, stream), "replay");
    cuda::check(cudaEventRecord(stop, stream), "event");
    cuda::check(cudaEventSynchronize(stop), "event");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start, stop), "event");
    const double us = 1e3 * ms / (replays * calls);
    // Bytes one call must read: the distinct chosen experts (at most rows·k) and the shared expert
    // with their scales, and the gate.
    const std::vector<int32_t> chosen = e_direct.download();
    double distinct = 0;
    for (int i = 0; i < calls; ++i) {
      std::vector<bool> seen(E);
      for (size_t j = 0; j < nk; ++j) {
        const int32_t e = chosen[i * nk + j];
        distinct += e >= 0 && e < E && !seen[size_t(e)];
        if (e >= 0 && e < E) seen[size_t(e)] = true;
      }
    }
    distinct /= calls;
    const double bytes = distinct * 3 * (wbytes + sbytes) + 3.0 * (s8 + s8scales) + 2.0 * E * dim;
    std::printf("moe graph E=%d k=%d rows=%d %dx%d fp4/fp8 %s: %d kernels per call, %.1f us per call, %.1f distinct "
                "experts, %.0f MB, %.0f GB/s\n",
                E, k, rows, inter, dim, path_name, kernels, us, distinct, bytes / 1e6, bytes / us / 1e3);
    cudaEventDestroy(start), cudaEventDestroy(stop);
    cudaGraphExecDestroy(exec), cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace dsv41
