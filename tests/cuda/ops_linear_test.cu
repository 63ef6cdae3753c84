// cuda::linear and cuda::linear_f32 against the CPU ops on the same random inputs, in every weight
// format, at the V4.1-Flash projection shapes and small odd ones.
//
// Tolerances. The GPU follows the CPU's precision flow (same act_quant, exact per-element
// products, fp32 block sums times the block scale, fp32 total); only the order of the fp32
// additions differs, which moves a sum by a few fp32 units (relative ~1e-7 of the terms). For
// linear(), y is then rounded to bf16: an output whose fp32 value lies that close to a bf16
// rounding boundary comes out one bf16 unit (2^-8 relative) apart. With about 1e-4 of the outputs
// flipping, NMSE ≈ 1e-4 · (2^-8)² / 3 ≈ 5e-10; the bound 1e-7 leaves room for outputs near zero,
// where the fp32 differences are largest relative to the value, and still fails on any real
// error (one wrong block scale alone gives NMSE > 1e-3). linear_f32 has no output rounding:
// NMSE ~ (fp32 unit)² ≈ 1e-14, bound 1e-10.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/linear.h"
#include "backend/cuda/linear.h"
#include "device_util.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Shape {
  const char* name;
  int M, N, K;
};

// The V4.1-Flash projections read at decode (M = 1, 8 tokens) and two small odd shapes (M > 8
// makes several passes over the weight; N not a multiple of the rows per block).
const Shape kShapes[] = {
    {"wq_a 1x1280x5120", 1, 1280, 5120},    {"wkv 8x512x5120", 8, 512, 5120},
    {"wo_b 1x5120x8192", 1, 5120, 8192},    {"wq_b 2x32768x1280", 2, 32768, 1280},
    {"expert w1 5x2304x5120", 5, 2304, 5120}, {"expert w2 1x5120x2304", 1, 5120, 2304},
    {"odd 13x72x96", 13, 72, 96},            {"odd 3x33x4096", 3, 33, 4096},
};

double run(WeightFormat format, const Shape& s, bool f32, uint32_t seed) {
  const std::vector<float> x = test::bf16_normal(size_t(s.M) * s.K, 1.0, seed);
  const std::vector<float> wv = test::bf16_normal(size_t(s.N) * s.K, 0.05, seed + 1);
  const test::OwnedWeight w = test::make_weight(format, wv, s.N, s.K);
  std::vector<float> want(size_t(s.M) * s.N);
  if (f32) linear_f32(x.data(), s.M, w.view(), want.data());
  else linear(x.data(), s.M, w.view(), want.data());

  DeviceArray<float> dx(x), dy(want.size());
  DeviceArray<uint8_t> ddata(w.data), dscale(w.scale.empty() ? std::vector<uint8_t>{0} : w.scale);
  dy.poison();
  Weight dw = w.view();
  dw.data = ddata.get();
  dw.scale = w.scale.empty() ? nullptr : dscale.get();
  if (f32) cuda::linear_f32(dx.get(), s.M, dw, dy.get());
  else cuda::linear(dx.get(), s.M, dw, dy.get());
  return test::nmse(dy.download(), want);
}

TEST(CudaLinear, MatchesCpuInEveryFormat) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4, WeightFormat::BF16, WeightFormat::F32})
    for (const Shape& s : kShapes) {
      const double e = run(f, s, false, seed += 7);
      std::printf("linear %-4s %-24s NMSE %.3g\n", test::format_name(f), s.name, e);
      EXPECT_LT(e, 1e-7) << test::format_name(f) << " " << s.name;
    }
}

TEST(CudaLinear, F32ProductMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 900;
  for (WeightFormat f : {WeightFormat::F32, WeightFormat::BF16, WeightFormat::FP8})
    for (const Shape& s : {kShapes[0], kShapes[6], Shape{"hc_fn 2x24x20480", 2, 24, 20480}}) {
      const double e = run(f, s, true, seed += 7);
      std::printf("linear_f32 %-4s %-24s NMSE %.3g\n", test::format_name(f), s.name, e);
      EXPECT_LT(e, 1e-10) << test::format_name(f) << " " << s.name;
    }
}

TEST(CudaLinear, RefusesKNotAMultipleOf32ForQuantizedWeights) {
  DSV41_REQUIRE_DEVICE();
  const Weight w{WeightFormat::FP8, 32, 48, nullptr, nullptr};
  EXPECT_THROW(cuda::linear(nullptr, 1, w, nullptr), Error);
}

}  // namespace
}  // namespace dsv41
