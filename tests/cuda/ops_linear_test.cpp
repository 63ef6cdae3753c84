// cuda::linear, cuda::linear_f32 and cuda::linear_grouped against the CPU ops on the same random inputs, in every weight
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
//
// The GEMM (gemm.cu, linear() at M ≥ gemm::kMinRows over fp8/fp4 weights) multiplies the exact values
// of the same quantized operands (act_quant's x_q·s and the weights' w_q·s, both exact in bf16)
// on bf16 wgmma with fp32 accumulation: the products are exact on both sides, and only the sums
// differ. The tensor cores add each k16 step's 16 products to the accumulator aligning to the
// largest term and truncating (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021),
// K/16 times along K, where the CPU sums each 32-block in its 8-lane order, scales it and adds the
// blocks in order, rounding to nearest: a few fp32 units relative to the terms apart (K/16 = 256
// truncations of ≤ 1 unit each at K = 4096: ≤ 2^-16 relative, ~2^-20 typically, as they are not
// all of one sign's size). So the qgemv reasoning above holds: only outputs within that distance
// of a bf16 rounding boundary (2^-8 relative) flip, by one unit, and the same bound 1e-7 applies
// (kGemmNmse); a layout or scale bug gives NMSE ~1 (one wrong 32-block scale among K/32 already
// gives ~1/(K/32) on its rows), a missing row or column a poisoned (non-finite) output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/linear.h"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemm_bf16.cuh"
#include "backend/cuda/linear.h"
#include "backend/cuda/rows.h"
#include "device_util.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Shape {
  const char* name;
  int M, N, K;
};

// The V4.1-Flash projections read at decode (M = 1, 8 tokens) and small odd shapes (M > 8 makes
// several passes over the weight; N not a multiple of the rows per block; K not a multiple of the
// GEMM's 128, which leaves M = 2 to the quantized GEMV; K beyond what one slice of x in the GEMV's
// shared memory holds, at one and two rows).
const Shape kShapes[] = {
    {"wq_a 1x1280x5120", 1, 1280, 5120},    {"wkv 8x512x5120", 8, 512, 5120},
    {"wo_b 1x5120x8192", 1, 5120, 8192},    {"wq_b 2x32768x1280", 2, 32768, 1280},
    {"expert w1 5x2304x5120", 5, 2304, 5120}, {"expert w2 1x5120x2304", 1, 5120, 2304},
    {"odd 13x72x96", 13, 72, 96},            {"odd 3x33x4096", 3, 33, 4096},
    {"odd 1x33x4096", 1, 33, 4096},          {"odd 2x40x160", 2, 40, 160},
    {"sliced 2x48x12320", 2, 48, 12320},     {"sliced 1x24x24608", 1, 24, 24608},
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

// The grouped product (wo_a): every group's rows against its own slice of x, in one call, equal to
// the CPU's linear() of each group's slice on the group's rows (the same tolerance as above), and
// bit-identical to cuda::linear of each group alone (the same per-row sums: for bf16/fp32 the
// same gemv over a strided input — or, from M = 64, the same bf16 GEMM with the group's offsets
// — or, for groups of an odd row count, and for fp8/fp4, linear itself on a copy).
TEST(CudaLinear, GroupedProductIsEachGroupsLinear) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 1300;
  struct Case {
    int M, groups, r, K;
  };
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::F32, WeightFormat::FP8, WeightFormat::FP4})
    for (const Case c : {Case{1, 8, 256, 1024}, Case{3, 4, 64, 256}, Case{11, 2, 32, 96}, Case{2, 3, 5, 64},
                         Case{100, 8, 128, 512}, Case{70, 4, 36, 288}, Case{300, 8, 128, 512}, Case{260, 3, 36, 128}}) {
      if (f == WeightFormat::FP8 && c.r % 32 != 0) continue;  // fp8 groups hold whole 32-row scale blocks
      const int N = c.groups * c.r;
      const std::vector<float> x = test::bf16_normal(size_t(c.M) * c.groups * c.K, 1.0, seed += 7);
      const std::vector<float> wv = test::bf16_normal(size_t(N) * c.K, 0.05, seed + 1);
      const test::OwnedWeight w = test::make_weight(f, wv, N, c.K);
      DeviceArray<float> dx(x), dy(size_t(c.M) * N), done(size_t(c.M) * N), dxg(size_t(c.M) * c.K), dyg(size_t(c.M) * c.r);
      DeviceArray<uint8_t> ddata(w.data), dscale(w.scale.empty() ? std::vector<uint8_t>{0} : w.scale);
      Weight dw = w.view();
      dw.data = ddata.get();
      dw.scale = w.scale.empty() ? nullptr : dscale.get();
      dy.poison();
      cuda::linear_grouped(dx.get(), c.M, c.groups, dw, dy.get());
      const std::vector<float> got = dy.download();
      std::vector<float> want(got.size()), alone(got.size());
      for (int g = 0; g < c.groups; ++g) {
        Weight wg = w.view(), dwg = dw;
        wg.rows = dwg.rows = c.r;
        wg.data += g * w.view().data_bytes() / c.groups;
        dwg.data += g * dw.data_bytes() / c.groups;
        if (dw.scale) wg.scale += g * w.view().scale_bytes() / c.groups, dwg.scale += g * dw.scale_bytes() / c.groups;
        std::vector<float> xg(size_t(c.M) * c.K), yg(size_t(c.M) * c.r);
        for (int m = 0; m < c.M; ++m)
          std::copy_n(x.begin() + (size_t(m) * c.groups + g) * c.K, c.K, xg.begin() + size_t(m) * c.K);
        linear(xg.data(), c.M, wg, yg.data());
        dxg.upload(xg);
        cuda::linear(dxg.get(), c.M, dwg, dyg.get());
        const std::vector<float> one = dyg.download();
        for (int m = 0; m < c.M; ++m) {
          std::copy_n(yg.begin() + size_t(m) * c.r, c.r, want.begin() + size_t(m) * N + g * c.r);
          std::copy_n(one.begin() + size_t(m) * c.r, c.r, alone.begin() + size_t(m) * N + g * c.r);
        }
      }
      const double e = test::nmse(got, want);
      std::printf("linear_grouped %-4s %d×%d groups of %d×%d NMSE %.3g\n", test::format_name(f), c.M, c.groups, c.r, c.K, e);
      EXPECT_LT(e, 1e-7) << test::format_name(f);
      EXPECT_EQ(std::memcmp(got.data(), alone.data(), got.size() * sizeof(float)), 0) << test::format_name(f);
    }
}

// wo_a on the device (linear_grouped_widened): an fp8 weight read as its codes and multiplied as
// its bf16 values gives, from gemm_bf16::kWgRows, the bits linear_grouped gives over those bf16
// values (the same warpgroup products and sums), and at every M (the swapped form's and the fp8
// GEMM's narrow tiles in between included, whose fp32 sums run in other orders) the CPU's grouped
// product within the GEMM's bound. The shapes: wo_a's at decode and prefill sizes (scaled down),
// groups of 96 rows (a 128-row tile's last warp past the group's end), one group, K not a multiple
// of 128 between the two (gemm_bf16's mma.sync form).
TEST(CudaLinear, GroupedWidenedIsTheBf16Weights) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 1500;
  struct Case {
    int M, groups, r, K;
  };
  for (const Case c : {Case{1, 8, 256, 1024}, Case{2, 8, 256, 1024}, Case{8, 4, 64, 256}, Case{9, 8, 128, 512},
                       Case{64, 3, 96, 128}, Case{64, 8, 256, 1024}, Case{80, 8, 128, 512}, Case{300, 8, 128, 512},
                       Case{5, 1, 32, 64}, Case{3, 2, 32, 4096}, Case{16, 2, 64, 192}}) {
    const int N = c.groups * c.r;
    const std::vector<float> x = test::bf16_normal(size_t(c.M) * c.groups * c.K, 1.0, seed += 7);
    const std::vector<float> wv = test::bf16_normal(size_t(N) * c.K, 0.05, seed + 1);
    const test::OwnedWeight w8 = test::make_weight(WeightFormat::FP8, wv, N, c.K);
    const test::OwnedWeight w16 = test::make_weight(WeightFormat::BF16, w8.values, N, c.K);  // exact: ≤ 4 significant bits
    ASSERT_EQ(w16.values, w8.values);
    DeviceArray<float> dx(x), dy(size_t(c.M) * N), dref(size_t(c.M) * N);
    DeviceArray<uint8_t> d8(w8.data), dscale(w8.scale), d16(w16.data);
    Weight dw8 = w8.view(), dw16 = w16.view();
    dw8.data = d8.get(), dw8.scale = dscale.get(), dw16.data = d16.get();
    dy.poison();
    cuda::linear_grouped_widened(dx.get(), c.M, c.groups, dw8, dy.get());
    cuda::linear_grouped(dx.get(), c.M, c.groups, dw16, dref.get());
    const std::vector<float> got = dy.download(), ref = dref.download();
    std::vector<float> want(got.size());
    for (int g = 0; g < c.groups; ++g) {
      Weight wg = w16.view();
      wg.rows = c.r;
      wg.data += g * wg.data_bytes();
      std::vector<float> xg(size_t(c.M) * c.K), yg(size_t(c.M) * c.r);
      for (int m = 0; m < c.M; ++m) std::copy_n(x.begin() + (size_t(m) * c.groups + g) * c.K, c.K, xg.begin() + size_t(m) * c.K);
      linear(xg.data(), c.M, wg, yg.data());
      for (int m = 0; m < c.M; ++m) std::copy_n(yg.begin() + size_t(m) * c.r, c.r, want.begin() + size_t(m) * N + g * c.r);
    }
    const double e = test::nmse(got, want);
    std::printf("linear_grouped_widened %d×%d groups of %d×%d NMSE %.3g\n", c.M, c.groups, c.r, c.K, e);
    EXPECT_LT(e, 1e-7) << "M=" << c.M;
    if (c.M >= cuda::gemm_bf16::kWgRows || (c.M > cuda::gemm_bf16::kSwapRows && c.K % 128 != 0)) {
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), got.size() * sizeof(float)), 0) << "M=" << c.M;
    }
  }
  const uint8_t bytes[1] = {};  // never read: the shape is refused first
  const Weight odd{WeightFormat::FP8, 64, 96, bytes, bytes};  // K not a multiple of 64
  EXPECT_THROW(cuda::linear_grouped_widened(nullptr, 1, 2, odd, nullptr), Error);
}

TEST(CudaLinear, RefusesKNotAMultipleOf32ForQuantizedWeights) {
  DSV41_REQUIRE_DEVICE();
  const Weight w{WeightFormat::FP8, 32, 48, nullptr, nullptr};
  EXPECT_THROW(cuda::linear(nullptr, 1, w, nullptr), Error);
}


// ---- The prefill GEMM ----------------------------------------------------------------------------

// NMSE bound of the GEMM against the CPU op (the header says why).
constexpr double kGemmNmse = 1e-7;

// Fast approximately normal values (Irwin-Hall of 4 uniforms: mean 0, stddev 1, |v| < 3.47): the
// GEMM cases need 10^7..10^8 values, too many for std::normal_distribution within the device budget.
struct FastRng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float normal() {
    const uint64_t r = next();
    float sum = 0;
    for (int i = 0; i < 4; ++i) sum += float((r >> (16 * i)) & 0xFFFF);
    return (sum / 65536.0f - 2.0f) * 1.7320508f;
  }
};

// Activations as the GEMM sees them: bf16, normal-like, each 32-block scaled by 2^e for e in
// [-4, 4] (so the x block scales differ), one value in 64 an outlier ×8.
std::vector<float> activations(int64_t M, int64_t K, uint64_t seed) {
  FastRng rng{seed};
  std::vector<float> x(size_t(M * K));
  for (int64_t i = 0; i < M * K; i += 32) {
    const float block = std::ldexp(1.0f, int(rng.next() % 9) - 4);
    for (int j = 0; j < 32; ++j) {
      const uint64_t r = rng.next();
      float v = rng.normal() * block;
      if (r % 64 == 0) v *= 8;
      x[size_t(i + j)] = round_bf16(v);
    }
  }
  return x;
}

// A weight quantized from normal values (stddev 0.05), as the checkpoint's; where big(n, k), times
// 2^21 (block scales past what the GEMM folds into its widening: its rare path).
test::OwnedWeight gemm_weight(WeightFormat format, int N, int K, uint64_t seed,
                              const std::function<bool(int, int)>& big = nullptr) {
  FastRng rng{seed};
  std::vector<float> v(size_t(N) * K);
  for (float& e : v) e = 0.05f * rng.normal();
  if (big)
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k)
        if (big(n, k)) v[size_t(n) * K + k] *= 0x1p21f;
  test::OwnedWeight o;
  o.format = format, o.rows = N, o.cols = K;
  if (format == WeightFormat::FP8) {
    o.data.resize(size_t(N) * K), o.scale.resize(fp8_weight_scale_count(N, K));
    quantize_fp8_weight(v.data(), N, K, o.data.data(), o.scale.data());
  } else {
    o.data.resize(fp4_weight_bytes(N, K)), o.scale.resize(fp4_weight_scale_count(N, K));
    quantize_fp4_weight(v.data(), N, K, o.data.data(), o.scale.data());
  }
  return o;
}

// act_quant on the device against the CPU's act_quant_fp8, bit for bit: each value code·s, read at
// value_offset's position, equals the CPU's dequantized value. A partial last row, zero blocks,
// tiny and huge blocks, values at e4m3 rounding ties; every position written (poisoned first).
TEST(CudaGemm, ActQuantMatchesCpuBitForBit) {
  DSV41_REQUIRE_DEVICE();
  const int64_t M = 131, K = 1024;
  std::vector<float> x = activations(M, K, 7);
  for (int64_t k = 0; k < 32; ++k) x[size_t(5 * K + k)] = 0;                            // all zero
  for (int64_t k = 0; k < 32; ++k) x[size_t(6 * K + 64 + k)] = round_bf16(1e-30f * float(k + 1));  // tiny
  for (int64_t k = 0; k < 32; ++k) x[size_t(7 * K + 96 + k)] = round_bf16(3e37f * float(k % 5 - 2));  // huge
  for (int64_t k = 0; k < 32; ++k) x[size_t(8 * K + 128 + k)] = 272.0f + 32.0f * float(k % 6);  // e4m3 ties
  std::vector<float> want = x;
  for (int64_t m = 0; m < M; ++m) act_quant_fp8(want.data() + m * K, int(K), 32);
  DeviceArray<float> dx(x);
  DeviceArray<uint16_t> xq(size_t(M * K));
  xq.poison();
  cuda::gemm::act_quant(dx.get(), M, K, xq.get(), nullptr);
  const std::vector<uint16_t> got = xq.download();
  int64_t wrong = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) {
      const float v = bf16_to_float(got[size_t(cuda::gemm::value_offset(m, k, K))]);
      const float ref = want[size_t(m * K + k)];
      if (std::memcmp(&v, &ref, 4) != 0 && !(v == 0 && ref == 0)) ++wrong;
    }
  EXPECT_EQ(wrong, 0);
}

struct GemmShape {
  const char* name;
  WeightFormat format;
  int N, K;
};

// V4.1-Flash (dim 4096) weights that prefill multiplies, and two odd shapes (N not a multiple of
// the 128-column tile nor of 32; K = 3 k-tiles).
const GemmShape kGemmShapes[] = {
    {"wq_a 1024x4096", WeightFormat::FP8, 1024, 4096},      {"wq_b 32768x1024", WeightFormat::FP8, 32768, 1024},
    {"wkv 512x4096", WeightFormat::FP8, 512, 4096},         {"wo_b 4096x8192", WeightFormat::FP8, 4096, 8192},
    {"shared w1 2048x4096", WeightFormat::FP8, 2048, 4096}, {"shared w2 4096x2048", WeightFormat::FP8, 4096, 2048},
    {"expert w1 2048x4096", WeightFormat::FP4, 2048, 4096}, {"expert w2 4096x2048", WeightFormat::FP4, 4096, 2048},
    {"odd 200x384", WeightFormat::FP8, 200, 384},           {"odd 200x384", WeightFormat::FP4, 200, 384},
};

// The rows the CPU reference computes: all when M ≤ 257; else the first 128 (every position in a
// row tile), 48 spread over the rest, and the last.
std::vector<int64_t> reference_rows(int64_t M) {
  std::vector<int64_t> rows;
  if (M <= 257) {
    for (int64_t m = 0; m < M; ++m) rows.push_back(m);
    return rows;
  }
  for (int64_t m = 0; m < 128; ++m) rows.push_back(m);
  for (int64_t i = 0; i < 48; ++i) rows.push_back(128 + (i * 7919) % (M - 129));
  rows.push_back(M - 1);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

struct GemmResult {
  double nmse = 0;
  double differing = 0;  // fraction of the compared outputs that differ from the CPU's
  double max_units = 0;  // the largest difference in bf16 units of the CPU's value
  bool all_written = true;
};

// y over all M rows through `gemm` (true: cuda::gemm::linear; false: cuda::linear), the CPU op
// over reference_rows(M).
GemmResult gemm_case(const test::OwnedWeight& w, const Weight& dw, int64_t M, uint64_t seed, bool gemm) {
  const int64_t N = w.rows, K = w.cols;
  const std::vector<float> x = activations(M, K, seed);
  DeviceArray<float> dx(x), dy(size_t(M * N));
  dy.poison();
  if (gemm) cuda::gemm::linear(dx.get(), M, dw, dy.get(), nullptr);
  else cuda::linear(dx.get(), M, dw, dy.get());
  const std::vector<float> y = dy.download();
  GemmResult r;
  for (float v : y) r.all_written = r.all_written && std::isfinite(v);
  const std::vector<int64_t> rows = reference_rows(M);
  std::vector<float> xs(rows.size() * size_t(K)), want(rows.size() * size_t(N)), got(want.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy_n(x.begin() + rows[i] * K, K, xs.begin() + int64_t(i) * K);
    std::copy_n(y.begin() + rows[i] * N, N, got.begin() + int64_t(i) * N);
  }
  linear(xs.data(), int64_t(rows.size()), w.view(), want.data());
  r.nmse = test::nmse(got, want);
  int64_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] == want[i]) continue;
    ++differing;
    r.max_units = std::max(r.max_units, std::fabs(double(got[i]) - want[i]) / test::bf16_ulp(want[i]));
  }
  r.differing = double(differing) / double(want.size());
  return r;
}

TEST(CudaGemm, MatchesCpuAtPrefillShapes) {
  DSV41_REQUIRE_DEVICE();
  uint64_t seed = 300;
  for (const GemmShape& s : kGemmShapes) {
    const test::OwnedWeight w = gemm_weight(s.format, s.N, s.K, seed += 11);
    DeviceArray<uint8_t> ddata(w.data), dscale(w.scale);
    Weight dw = w.view();
    dw.data = ddata.get(), dw.scale = dscale.get();
    const bool odd = s.K == 384;
    for (int64_t M : {int64_t(64), int64_t(257), int64_t(odd ? 130 : 4096)}) {
      ASSERT_TRUE(cuda::gemm::usable(M, dw));
      const GemmResult r = gemm_case(w, dw, M, seed += 11, true);
      std::printf("gemm %-4s %-22s M %5lld  NMSE %.3g  differing %.4f  max %.2f bf16 units\n",
                  test::format_name(s.format), s.name, static_cast<long long>(M), r.nmse, r.differing, r.max_units);
      EXPECT_TRUE(r.all_written) << s.name << " M " << M;
      EXPECT_LT(r.nmse, kGemmNmse) << test::format_name(s.format) << " " << s.name << " M " << M;
    }
  }
}

// Block scales of 2 and more, too large to fold into the widening's power of two (gemm.cu Rows):
// the k-tiles of a warpgroup that holds one take the rare path, two multiplies, and every product
// stays exact, so the bound is the GEMM's (kGemmNmse), checked apart for the outputs of rows with
// large blocks and of the others (whose k-tiles share the rare path with them). Large blocks (×2^21:
// fp4 scales ~2^16, fp8 ~2^10): fp8 whole 32 × 32 tiles, rows 96..127 of each 128 at every other
// k-tile (the narrow tiling's second warpgroup takes the rare path, its first the folded one); fp4
// single 32-blocks of a third of the rows, every third k-tile. A folded scale applied where it
// overflows gives infinities; a rare path that skips its first multiply gives outputs 2^-126 or
// 2^-120 too small (NMSE ~1).
TEST(CudaGemm, LargeBlockScalesMatchCpu) {
  DSV41_REQUIRE_DEVICE();
  uint64_t seed = 800;
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4}) {
    const bool fp8 = f == WeightFormat::FP8;
    auto big = [fp8](int n, int k) {
      return fp8 ? n % 128 >= 96 && k / 128 % 2 == 0 : n % 3 == 0 && k / 128 % 3 == 1 && k % 128 < 32;
    };
    const int N = 320, K = 1024;
    const test::OwnedWeight w = gemm_weight(f, N, K, seed += 13, big);
    DeviceArray<uint8_t> ddata(w.data), dscale(w.scale);
    Weight dw = w.view();
    dw.data = ddata.get(), dw.scale = dscale.get();
    for (int64_t M : {int64_t(2), int64_t(40), int64_t(300)}) {
      const std::vector<float> x = activations(M, K, seed += 13);
      DeviceArray<float> dx(x), dy(size_t(M * N));
      dy.poison();
      cuda::gemm::linear(dx.get(), M, dw, dy.get(), nullptr);
      const std::vector<float> y = dy.download();
      std::vector<float> want(y.size());
      linear(x.data(), M, w.view(), want.data());
      std::vector<float> got_big, want_big, got_small, want_small;
      for (int64_t m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
          const bool large = fp8 ? n % 128 >= 96 : n % 3 == 0;
          (large ? got_big : got_small).push_back(y[size_t(m * N + n)]);
          (large ? want_big : want_small).push_back(want[size_t(m * N + n)]);
        }
      const double eb = test::nmse(got_big, want_big), es = test::nmse(got_small, want_small);
      std::printf("gemm %-4s large block scales M %3lld  NMSE %.3g (rows with them), %.3g (the others)\n",
                  test::format_name(f), static_cast<long long>(M), eb, es);
      EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float v) { return std::isfinite(v); })) << "M " << M;
      EXPECT_LT(eb, kGemmNmse) << test::format_name(f) << " M " << M;
      EXPECT_LT(es, kGemmNmse) << test::format_name(f) << " M " << M;
    }
  }
}

// cuda::linear itself at prefill sizes (the GEMM from M = 64 on), both formats.
TEST(CudaGemm, LinearAtPrefillSizesMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint64_t seed = 700;
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4}) {
    const test::OwnedWeight w = gemm_weight(f, 1000, 2048, seed += 13);
    DeviceArray<uint8_t> ddata(w.data), dscale(w.scale);
    Weight dw = w.view();
    dw.data = ddata.get(), dw.scale = dscale.get();
    for (int64_t M : {int64_t(63), int64_t(64), int64_t(300)}) {
      const GemmResult r = gemm_case(w, dw, M, seed += 13, false);
      std::printf("linear %-4s 1000x2048 M %3lld  NMSE %.3g  differing %.4f\n", test::format_name(f),
                  static_cast<long long>(M), r.nmse, r.differing);
      EXPECT_TRUE(r.all_written);
      EXPECT_LT(r.nmse, kGemmNmse) << test::format_name(f) << " M " << M;
    }
  }
}

// The two tilings compute every output with the same instructions in the same order (gemm.cuh
// Tiling), so they agree bit for bit: at row counts ending inside a narrow tile (of 32, 48 and 64
// rows), at a wide tile's end and past a raster band, on an odd N and a long K, both formats. A
// wrong swizzle, scale row or tile bound in either gives differing or still-poisoned outputs.
TEST(CudaGemm, NarrowTilingEqualsWide) {
  DSV41_REQUIRE_DEVICE();
  uint64_t seed = 900;
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4})
    for (const auto& [N, K] : {std::pair{200, 384}, std::pair{1000, 2048}}) {
      const test::OwnedWeight w = gemm_weight(f, N, K, seed += 7);
      DeviceArray<uint8_t> ddata(w.data), dscale(w.scale);
      Weight dw = w.view();
      dw.data = ddata.get(), dw.scale = dscale.get();
      for (int64_t M : {int64_t(20), int64_t(40), int64_t(64), int64_t(77), int64_t(128), int64_t(200), int64_t(2100)}) {
        DeviceArray<float> dx(activations(M, K, seed += 7)), wide(size_t(M) * N), narrow(size_t(M) * N);
        wide.poison(), narrow.poison();
        cuda::gemm::linear(dx.get(), M, dw, wide.get(), nullptr, cuda::gemm::Tiling::wide);
        cuda::gemm::linear(dx.get(), M, dw, narrow.get(), nullptr, cuda::gemm::Tiling::narrow);
        const std::vector<float> yw = wide.download(), yn = narrow.download();
        EXPECT_TRUE(std::all_of(yw.begin(), yw.end(), [](float v) { return std::isfinite(v); }))
            << test::format_name(f) << " " << N << "x" << K << " M " << M;
        EXPECT_EQ(yn, yw) << test::format_name(f) << " " << N << "x" << K << " M " << M;
      }
    }
}

// Split-K (rows.h split_k: decode's small weights, whose output tiles leave SMs idle) sums the same
// exact products as one split, in another order: its fp32 sums differ by a few fp32 units relative
// (the tensor cores' truncations, ≤ (K/16)·2^-24 ≈ 1.5e-5 at K = 4096, typically far less), so the
// bf16-rounded outputs agree except where a rounding boundary falls between the two sums: a
// fraction of about that relative difference over a bf16 unit (2^-8), ≤ 4e-3 at worst, each by one
// unit of the larger terms (an output near zero by cancellation may move by more of its own
// units). Bounds: at most 1% of outputs differ, and their NMSE stays under the GEMM's bound against
// the CPU (kGemmNmse, whose argument is the same flips). A split that drops or doubles a K range
// moves every output by whole products (NMSE ~1); a lost split leaves poisoned NaNs.
TEST(CudaGemm, SplitKAgreesWithOneSplit) {
  DSV41_REQUIRE_DEVICE();
  uint64_t seed = 1300;
  for (WeightFormat f : {WeightFormat::FP8, WeightFormat::FP4})
    for (const auto& [N, K] : {std::pair{512, 4096}, std::pair{2048, 4096}, std::pair{200, 1152}}) {
      const test::OwnedWeight w = gemm_weight(f, N, K, seed += 7);
      DeviceArray<uint8_t> ddata(w.data), dscale(w.scale);
      Weight dw = w.view();
      dw.data = ddata.get(), dw.scale = dscale.get();
      for (int64_t M : {int64_t(64), int64_t(80)}) {
        const int64_t tiles = (M + 63) / 64 * ((N + 127) / 128);  // the narrow tiling's
        ASSERT_GT(cuda::split_k(tiles, K / 128, 2).splits, 1) << N << "x" << K << " M " << M;
        DeviceArray<float> dx(activations(M, K, seed += 7)), split(size_t(M) * N), one(size_t(M) * N);
        split.poison(), one.poison();
        cuda::gemm::linear(dx.get(), M, dw, split.get(), nullptr);
        cuda::gemm::linear(dx.get(), M, dw, one.get(), nullptr, cuda::gemm::Tiling::narrow);
        const std::vector<float> ys = split.download(), yo = one.download();
        int64_t differing = 0;
        for (size_t i = 0; i < ys.size(); ++i) {
          ASSERT_TRUE(std::isfinite(ys[i])) << N << "x" << K << " M " << M << " output " << i;
          differing += ys[i] != yo[i];
        }
        const double e = test::nmse(ys, yo);
        std::printf("split-K %-4s %4dx%-5d M %3lld: %lld of %zu outputs differ, NMSE %.3g\n", test::format_name(f), N,
                    K, static_cast<long long>(M), static_cast<long long>(differing), ys.size(), e);
        EXPECT_LE(double(differing), 0.01 * double(ys.size())) << N << "x" << K << " M " << M;
        EXPECT_LT(e, kGemmNmse) << N << "x" << K << " M " << M;
      }
    }
}

// ---- The bf16 prefill GEMM ------------------------------------------------------------------------

// linear and linear_f32 over bf16 weights at M ≥ gemm_bf16::kMinRows (gemm_bf16.cu; linear_grouped's groups are in
// the test above), by mma.sync below gemm_bf16::kWgRows rows and by the warpgroup MMA from it (K a
// multiple of 64). The products of bf16 values are exact in fp32 on both sides; the sums differ.
// The tensor cores add each mma's 16 products to the accumulator aligning to the largest term and
// truncating (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021), K/16 times along K,
// where the CPU rounds each add to nearest: the truncations all lean toward zero, up to one fp32
// unit of the accumulator each, so y may move by up to (K/16)·2^-24 relative — 2e-5 at K = 5120,
// NMSE ≤ 4e-10, where two round-to-nearest orders stay near K·2^-48 ≈ 2e-11. Bound 1e-9 for
// linear_f32; with y rounded to bf16 (linear) the flips dominate, as for the fp8 GEMM: bound 1e-7.
// A wrong swizzle, fragment order or tail (K not a multiple of the 64-wide k-tile; M, N not of
// 128) puts wrong or missing products into whole rows: NMSE ~1, or NaN from the poisoned output.
TEST(CudaGemmBf16, MatchesCpuAtPrefillShapes) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 2100;
  for (const Shape& s : {Shape{"compressor 300x512x5120", 300, 512, 5120}, Shape{"weights_proj 130x64x5120", 130, 64, 5120},
                         Shape{"odd 77x50x72", 77, 50, 72}, Shape{"64x1000x1024", 64, 1000, 1024},
                         Shape{"gate 64x16x5120", 64, 16, 5120}, Shape{"wgmma 520x1024x4096", 520, 1024, 4096},
                         Shape{"wgmma odd N 256x201x128", 256, 201, 128}, Shape{"wgmma one k-tile 300x130x64", 300, 130, 64}})
    for (bool f32 : {false, true}) {
      const double e = run(WeightFormat::BF16, s, f32, seed += 7);
      std::printf("bf16 gemm %s %-26s NMSE %.3g\n", f32 ? "linear_f32" : "linear    ", s.name, e);
      EXPECT_LT(e, f32 ? 1e-9 : 1e-7) << s.name << (f32 ? " linear_f32" : " linear");
    }
}

}  // namespace
}  // namespace dsv41
