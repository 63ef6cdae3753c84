// The vision tower's CUDA ops (backend/cuda/vision.h) against the CPU ops (backend/cpu/vision.h,
// vision_rope.h, pixel_unshuffle.h) on the same random bf16 inputs, at the released tower's shapes
// (dim 1024, 16 heads of 64, inter 2816, patch rows padded to 592 columns) and the fixture's (dim 64,
// 4 heads of 16), over several images' rows.
//
// Tolerances, op by op:
//  * linear_bias: cuda::linear_f32's GEMM (the tensor cores from 2 rows) then the CPU's bias
//    addition and one rounding. As in ops_linear_test: the products of bf16 values are exact on both
//    sides, only the fp32 sums' order (and the tensor cores' truncating alignment) differ, by a few
//    fp32 units relative to the terms, so only outputs that close to a bf16 rounding boundary flip,
//    by one unit: NMSE ≈ (fraction flipped ~1e-4) · (2^-8)² / 3 ≈ 5e-10; bound 1e-7 (ops_linear_test's
//    kGemmNmse), while one wrong bias or column gives NMSE > 1e-4.
//  * add_bf16 and the pixel unshuffle: the same one fp32 addition / a copy: bit for bit.
//  * silu_mul, gelu, vision_rope: the CPU's expression in its order with CUDA's expf, erff, cosf and
//    sinf, which differ from the C library's by at most 2 fp32 units; an output moves only when that
//    puts an intermediate across a bf16 rounding boundary (relative 2^-9 away at most, the error
//    2^-23: a fraction ~2^-14 of them), by one unit per rounding it passes through: every output
//    within one bf16 unit of the CPU's (two for silu_mul, which rounds twice), plus the
//    cancellations' absolute slack where an op has them (gelu's tail, the rotation; stated there),
//    and at least 99% bit for bit.
//  * vision_attention: against a double-precision softmax(q·kᵀ/√d)·v on the same inputs, CPU and
//    GPU alike: each output within one bf16 unit of the exact value plus the fp32 error bound of
//    the sums, (n + 16) fp32 units of max|v| (recursive summation of n terms p_j·v_j with Σp = 1
//    errs by at most (n − 1)·u·max|v|; the scores, exp and the normalisation add a few units: a
//    score's rounding, a head_dim-term dot product of unit-size values times 1/√head_dim, moves its
//    p by a few units relative); and the GPU within twice that of the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/pixel_unshuffle.h"
#include "backend/cpu/vision.h"
#include "backend/cpu/vision_rope.h"
#include "backend/cuda/vision.h"
#include "device_util.h"
#include "forward/vision_layout.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

constexpr double kGemmNmse = 1e-7;

// A device copy of a bf16 weight made by test::make_weight.
struct DeviceWeight {
  DeviceArray<uint8_t> data;
  Weight w;
  explicit DeviceWeight(const test::OwnedWeight& o) : data(o.data), w(o.view()) { w.data = data.get(); }
};

struct LinearShape {
  const char* name;
  int M, N, K;
};

// The released tower's projections over one 1,550-patch image, the fixture's over its two images
// (110 patches, 18 tokens), and a single row (the GEMV).
const LinearShape kLinearShapes[] = {
    {"patch_embed 1550x1024x592", 1550, 1024, 592}, {"wqkv 1550x3072x1024", 1550, 3072, 1024},
    {"w2 300x1024x2816", 300, 1024, 2816},           {"aligner w1 200x5120x9216", 200, 5120, 9216},
    {"tiny patch_embed 110x64x592", 110, 64, 592},    {"tiny aligner w1 18x128x576", 18, 128, 576},
    {"one row 1x192x64", 1, 192, 64},
};

// Each shape with one of the three bias kinds in turn (bf16, none, f32: each kind on the GEMMs, the
// one-row GEMV with a bf16 bias), so that the CPU's products stay few. K = 592 (the padded patch
// embedding) takes the mma.sync GEMM, K = 1024 from 256 rows the warpgroup one.
TEST(CudaVision, LinearBiasMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 1;
  int kind = 0;
  for (const LinearShape& s : kLinearShapes) {
    const bool with_bias = kind != 1;
    const WeightFormat bias_format = kind == 2 ? WeightFormat::F32 : WeightFormat::BF16;
    kind = (kind + 1) % 3;
    const std::vector<float> x = test::bf16_normal(size_t(s.M) * s.K, 1.0, seed++);
    const test::OwnedWeight w = test::make_weight(WeightFormat::BF16, test::bf16_normal(size_t(s.N) * s.K, 0.05, seed++), s.N, s.K);
    const test::OwnedWeight b = test::make_weight(bias_format, test::bf16_normal(size_t(s.N), 0.5, seed++), 1, s.N);
    const Weight bias = b.view();
    std::vector<float> want(size_t(s.M) * s.N);
    linear_bias(x.data(), s.M, w.view(), with_bias ? &bias : nullptr, want.data());
    DeviceArray<float> dx(x), dy(want.size());
    DeviceWeight dw(w), db(b);
    dy.poison();
    cuda::linear_bias(dx.get(), s.M, dw.w, with_bias ? &db.w : nullptr, dy.get());
    const double e = test::nmse(dy.download(), want);
    std::printf("linear_bias %-28s bias %-4s NMSE %.3g\n", s.name, with_bias ? test::format_name(bias_format) : "none", e);
    EXPECT_LE(e, kGemmNmse) << s.name;
  }
}

// got within `units` bf16 units of want (plus `slack`), and at least 99% bit for bit.
void expect_near_cpu(const std::vector<float>& got, const std::vector<float>& want, double units, double slack, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], units * test::bf16_ulp(want[i]) + slack) << what << " element " << i;
    same += got[i] == want[i];
  }
  EXPECT_GE(double(same), 0.99 * double(got.size())) << what;
  std::printf("%s: %zu of %zu bit for bit\n", what, same, got.size());
}

TEST(CudaVision, ElementwiseOpsMatchCpu) {
  DSV41_REQUIRE_DEVICE();
  const int64_t M = 333, inter = 2816;
  // add: exact.
  std::vector<float> x = test::bf16_normal(size_t(M * 1024), 1.0, 11), y = test::bf16_normal(size_t(M * 1024), 0.3, 12);
  DeviceArray<float> dx(x), dy(y);
  add_bf16(x.data(), y.data(), int64_t(x.size()));
  cuda::add_bf16(dx.get(), dy.get(), int64_t(x.size()));
  EXPECT_EQ(dx.download(), x);

  // silu_mul over gate and up of w1's output size; gelu over a wide range (erf's tails included).
  const std::vector<float> gu = test::bf16_normal(size_t(M * 2 * inter), 2.0, 13);
  std::vector<float> want(size_t(M * inter));
  silu_mul(gu.data(), M, inter, want.data());
  DeviceArray<float> dgu(gu), dout(want.size());
  dout.poison();
  cuda::silu_mul(dgu.get(), M, inter, dout.get());
  expect_near_cpu(dout.download(), want, 2, 0, "silu_mul");

  // gelu: 0.5·x·(1 + erf(x/√2)) cancels for negative x: erff and the C library's erf differ by up
  // to 3 units of 2^-24 near -1, which is |x|·2^-22 of the result at most (the slack), and a large
  // part of it below x ≈ -2.5 (1 + erf ≈ 4e-4 there). The 99% rule holds over |x| < 2, where
  // 1 + erf ≥ 0.045 keeps that difference below 2^-17 relative (a flip chance ~2^-9).
  const std::vector<float> g0 = test::bf16_uniform(size_t(M * 5120), -8.0, 8.0, 14);
  std::vector<float> g = g0;
  DeviceArray<float> dg(g);
  gelu(g.data(), int64_t(g.size()));
  cuda::gelu(dg.get(), int64_t(g.size()));
  const std::vector<float> got = dg.download();
  size_t conditioned = 0, same = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_NEAR(got[i], g[i], test::bf16_ulp(g[i]) + std::fabs(g0[i]) * 0x1p-22) << "gelu element " << i << " of x " << g0[i];
    if (std::fabs(g0[i]) < 2) conditioned++, same += got[i] == g[i];
  }
  EXPECT_GE(double(same), 0.99 * double(conditioned)) << "gelu";
}

// Images of grids that end mid-cell and a single patch, as the call stacks them.
const std::vector<std::pair<int, int>> kGrids = {{5, 7}, {4, 3}, {1, 1}, {9, 6}};

std::vector<VisionImage> grid_images() {
  static const uint16_t none = 0;
  std::vector<VisionImage> images;
  for (auto [h, w] : kGrids) images.push_back(VisionImage{&none, h, w});
  return images;
}

TEST(CudaVision, RopeMatchesCpuAtEachPatchsPlace) {
  DSV41_REQUIRE_DEVICE();
  const VisionLayout l = vision_layout(grid_images(), 3);
  for (auto [heads, head_dim] : {std::pair{4, 16}, std::pair{16, 64}}) {
    const VisionRope rope(head_dim, 10000.0);
    const int64_t width = int64_t(heads) * head_dim, row = 3 * width;
    std::vector<float> qkv = test::bf16_normal(size_t(l.patches * row), 1.0, uint32_t(head_dim));
    DeviceArray<float> d(qkv), freqs(rope.frequencies());
    DeviceArray<int32_t> places(l.places);
    for (int64_t r = 0; r < l.patches; ++r) {
      rope.apply(qkv.data() + r * row, heads, l.places[size_t(2 * r)], l.places[size_t(2 * r + 1)]);
      rope.apply(qkv.data() + r * row + width, heads, l.places[size_t(2 * r)], l.places[size_t(2 * r + 1)]);
    }
    cuda::vision_rope(d.get(), l.patches, heads, head_dim, places.get(), freqs.get());
    const std::vector<float> got = d.download();
    // v is not touched; q and k as the CPU's. x1·cos − x2·sin errs by (|x1| + |x2|)·2^-23 with
    // cosf/sinf's 2 units: slack 2^-19 for inputs within 8 standard deviations.
    for (int64_t r = 0; r < l.patches; ++r)
      ASSERT_TRUE(std::equal(got.begin() + r * row + 2 * width, got.begin() + (r + 1) * row, qkv.begin() + r * row + 2 * width)) << r;
    expect_near_cpu(got, qkv, 1, 0x1p-19, head_dim == 16 ? "vision_rope 4x16" : "vision_rope 16x64");
  }
}

TEST(CudaVision, PixelUnshuffleIsCpus) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<VisionImage> images = grid_images();
  const int r = 3;
  const int64_t dim = 64, rr = r * r;
  const VisionLayout l = vision_layout(images, r);
  const std::vector<float> x = test::bf16_normal(size_t(l.patches * dim), 1.0, 21);
  DeviceArray<float> dx(x), dout(size_t(l.tokens * dim * rr));
  DeviceArray<int32_t> sources(l.unshuffle);
  dout.poison();
  cuda::pixel_unshuffle(dx.get(), dim, sources.get(), l.tokens, r, dout.get());
  const std::vector<float> got = dout.download();
  for (size_t i = 0; i < images.size(); ++i) {
    std::vector<float> want(size_t((l.token_first[i + 1] - l.token_first[i]) * dim * rr));
    pixel_unshuffle(x.data() + l.patch_first[i] * dim, images[i].n_vit_h, images[i].n_vit_w, dim, r, want.data());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), got.begin() + l.token_first[i] * dim * rr)) << "image " << i;
  }
}

// softmax(q·kᵀ/√d)·v per head in double, o [n, heads·d].
std::vector<double> exact_attention(const std::vector<float>& qkv, int64_t n, int heads, int d) {
  const int64_t width = int64_t(heads) * d, row = 3 * width;
  std::vector<double> o(static_cast<size_t>(n * width)), s(static_cast<size_t>(n));
  for (int h = 0; h < heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      double top = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qkv[size_t(i * row + h * d + c)]) * qkv[size_t(j * row + width + h * d + c)];
        s[size_t(j)] = dot / std::sqrt(double(d));
        top = std::max(top, s[size_t(j)]);
      }
      for (int64_t j = 0; j < n; ++j) sum += s[size_t(j)] = std::exp(s[size_t(j)] - top);
      for (int c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j) acc += s[size_t(j)] * qkv[size_t(j * row + 2 * width + h * d + c)];
        o[size_t(i * width + h * d + c)] = acc / sum;
      }
    }
  return o;
}

TEST(CudaVision, AttentionWithinTheFp32BoundOfExact) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t n;
    int heads, d;
  };
  // One patch; the fixture's images (40 and 70 patches); query blocks and key tiles that end
  // mid-way; a released-width head at a few hundred patches.
  for (const Case& k : {Case{1, 4, 16}, Case{40, 4, 16}, Case{70, 4, 16}, Case{97, 16, 64}, Case{700, 16, 64}}) {
    const int64_t width = int64_t(k.heads) * k.d;
    const std::vector<float> qkv = test::bf16_normal(size_t(k.n * 3 * width), 1.0, uint32_t(k.n));
    std::vector<float> cpu(size_t(k.n * width));
    vision_attention(qkv.data(), k.n, k.heads, k.d, cpu.data());
    DeviceArray<float> dqkv(qkv), dout(cpu.size());
    dout.poison();
    cuda::vision_attention(dqkv.get(), k.n, k.heads, k.d, dout.get());
    const std::vector<float> gpu = dout.download();
    const std::vector<double> exact = exact_attention(qkv, k.n, k.heads, k.d);
    double vmax = 0;
    for (int64_t j = 0; j < k.n; ++j)
      for (int64_t c = 0; c < width; ++c) vmax = std::max(vmax, std::fabs(double(qkv[size_t(j * 3 * width + 2 * width + c)])));
    const double slack = double(k.n + 16) * test::kF32Unit * vmax;
    size_t same = 0;
    for (size_t i = 0; i < exact.size(); ++i) {
      ASSERT_NEAR(cpu[i], exact[i], test::bf16_ulp(exact[i]) + slack) << "cpu n " << k.n << " element " << i;
      ASSERT_NEAR(gpu[i], exact[i], test::bf16_ulp(exact[i]) + slack) << "gpu n " << k.n << " element " << i;
      ASSERT_NEAR(gpu[i], cpu[i], 2 * (test::bf16_ulp(exact[i]) + slack)) << "n " << k.n << " element " << i;
      ASSERT_EQ(gpu[i], round_bf16(gpu[i])) << "not a bf16 value";
      same += gpu[i] == cpu[i];
    }
    std::printf("vision_attention n %lld, %d x %d: %zu of %zu equal to the CPU's\n", (long long)k.n, k.heads, k.d, same, exact.size());
  }
}

TEST(CudaVision, BadShapesAreRefused) {
  DSV41_REQUIRE_DEVICE();
  DeviceArray<float> x(size_t(3 * 128));
  DeviceArray<int32_t> places(size_t(2));
  EXPECT_THROW(cuda::vision_attention(x.get(), 1, 1, 128, x.get()), Error);
  EXPECT_THROW(cuda::vision_rope(x.get(), 1, 1, 6, places.get(), x.get()), Error);
  const test::OwnedWeight w = test::make_weight(WeightFormat::BF16, test::bf16_normal(64, 1.0, 1), 8, 8);
  const test::OwnedWeight b = test::make_weight(WeightFormat::BF16, test::bf16_normal(4, 1.0, 2), 1, 4);
  DeviceWeight dw(w), db(b);
  EXPECT_THROW(cuda::linear_bias(x.get(), 2, dw.w, &db.w, x.get()), Error);  // 4 bias values for 8 outputs
}

}  // namespace
}  // namespace dsv41
