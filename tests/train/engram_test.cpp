// src/train/grad/engram.h, with the lookup before it (embedding.h's gather of the n-gram rows,
// linear.h's wkv): the backward of the whole Engram update against central differences (table,
// wkv, streams, q_weight, k_weight), the clamp's flat region, and the forwards against the CPU ops
// (backend/cpu/engram.h engram_gather and engram_gate).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/engram.h"
#include "gradcheck.h"
#include "numerics/types.h"
#include "train/grad/embedding.h"
#include "train/grad/engram.h"
#include "train/grad/linear.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

constexpr double kNormEps = 1e-20;

TEST(GradEngram, LookupAndGateMatchCentralDifferences) {
  const int64_t rows = 3, hc = 4, d = 4, hd = 3, cols = 2, table_rows = 5;
  const std::vector<int64_t> ids = {0, 3, 3, 1, 4, 0};  // [rows, cols]; row 2 never, row 3 twice
  std::vector<double> table = normal_values(size_t(table_rows * hd), 1.0, 1);
  std::vector<double> wkv = normal_values(size_t((hc + 1) * d * cols * hd), 0.5, 2);
  std::vector<double> X = normal_values(size_t(rows * hc * d), 1.0, 3);
  std::vector<double> qw = normal_values(size_t(hc * d), 1.0, 4), kw = normal_values(size_t(hc * d), 1.0, 5);
  const std::vector<double> c = normal_values(X.size(), 1.0, 6);
  std::vector<double> emb(size_t(rows * cols * hd)), kv(size_t(rows * (hc + 1) * d)), out(X.size());
  grad::EngramGateSaved<double> saved;
  auto loss = [&] {
    grad::gather_rows_forward(table.data(), table_rows, hd, ids.data(), rows * cols, emb.data());
    grad::linear_forward(emb.data(), rows, cols * hd, wkv.data(), (hc + 1) * d, kv.data());
    grad::engram_gate_forward(X.data(), kv.data(), qw.data(), kw.data(), rows, int(hc), d, kNormEps, out.data(), saved);
    return weighted_sum(c, out);
  };
  loss();
  // The signed square root has a kink at |dot| = 1e-6 and is steep near it; the data keeps every
  // dot far above (a step moves a dot by ~1e-5 at most).
  for (double dot : saved.dot) ASSERT_GT(std::fabs(dot), 1e-2);
  std::vector<double> dX(X.size(), 0.0), dkv(kv.size(), 0.0), dqw(qw.size(), 0.0), dkw(kw.size(), 0.0);
  grad::engram_gate_backward(X.data(), kv.data(), qw.data(), kw.data(), rows, int(hc), d, saved, c.data(), dX.data(),
                             dkv.data(), dqw.data(), dkw.data());
  std::vector<double> demb(emb.size(), 0.0), dwkv(wkv.size(), 0.0), dtable(table.size(), 0.0);
  grad::linear_backward(emb.data(), rows, cols * hd, wkv.data(), (hc + 1) * d, dkv.data(), demb.data(), dwkv.data());
  grad::gather_rows_backward(demb.data(), hd, ids.data(), rows * cols, dtable.data());
  expect_gradient("dX", X, dX, loss);
  expect_gradient("dq_weight", qw, dqw, loss);
  expect_gradient("dk_weight", kw, dkw, loss);
  expect_gradient("dwkv", wkv, dwkv, loss);
  expect_gradient("dtable", table, dtable, loss);
}

// A stream orthogonal to its key (dot = 0 < 1e-6) sits on the clamp's flat part: gate σ(+1e-3)
// (copysign of +0), and nothing flows back through the gate, only the residual's own gradient.
TEST(GradEngram, BelowTheClampTheGatePassesNoGradient) {
  const std::vector<double> X = {1, 0}, kv = {0, 1, /* value */ 2, 3}, qw = {1, 1}, kw = {1, 1};
  std::vector<double> out(2);
  grad::EngramGateSaved<double> saved;
  grad::engram_gate_forward(X.data(), kv.data(), qw.data(), kw.data(), 1, 1, 2, kNormEps, out.data(), saved);
  const double g = 1 / (1 + std::exp(-1e-3));
  EXPECT_NEAR(out[0], 1 + 2 * g, 1e-15);
  EXPECT_NEAR(out[1], 3 * g, 1e-15);
  std::vector<double> dX(2, 0.0), dkv(4, 0.0), dqw(2, 0.0), dkw(2, 0.0);
  const std::vector<double> dout = {1, 1};
  grad::engram_gate_backward(X.data(), kv.data(), qw.data(), kw.data(), 1, 1, 2, saved, dout.data(), dX.data(), dkv.data(),
                             dqw.data(), dkw.data());
  EXPECT_EQ(dX, (std::vector<double>{1, 1}));
  EXPECT_EQ(dkv[0], 0.0);
  EXPECT_EQ(dkv[1], 0.0);
  EXPECT_EQ(dqw, (std::vector<double>{0, 0}));
}

// The fp8 table's rows gathered by the CPU are exactly the dequantized table's rows: e4m3 × 2^k is
// a bf16 value (3 mantissa bits, the exponent within range), so its rounding to bf16 is exact.
TEST(GradEngram, GatherEqualsTheCpuOpOnTheDequantizedTable) {
  const int64_t table_rows = 40, hd = 64;
  const std::vector<float> values = test::bf16_normal(size_t(table_rows * hd), 0.5, 7);
  const test::OwnedWeight table = test::make_weight(WeightFormat::FP8, values, int(table_rows), int(hd));
  // The CPU op reads one ue8m0 scale per row and 32 values; make that layout from the 32×32 blocks.
  std::vector<uint8_t> row_scales(size_t(table_rows * hd / 32));
  for (int64_t r = 0; r < table_rows; ++r)
    for (int64_t b = 0; b < hd / 32; ++b) row_scales[size_t(r * (hd / 32) + b)] = table.scale[size_t((r / 32) * (hd / 32) + b)];
  const std::vector<int64_t> ids = {5, 39, 0, 5};
  std::vector<float> out_cpu(ids.size() * hd);
  engram_gather(table.data.data(), row_scales.data(), hd, ids.data(), int(ids.size()), out_cpu.data());
  const std::vector<double> t(table.values.begin(), table.values.end());
  std::vector<double> out(out_cpu.size());
  grad::gather_rows_forward(t.data(), table_rows, hd, ids.data(), int64_t(ids.size()), out.data());
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(double(out_cpu[i]), out[i]) << i;
}

// The CPU's gate in fp32: A errs by (d + 1) fp32 units of Σ|h w key| (w = q ⊙ k rounded once),
// each inverse RMS by (d/2 + 5) units, and three products by one each, so
// Δdot ≤ (2d + 15) u · Σ|h w key| · rh rk / √d; the root moves by Δdot / (2 sqrt|dot|), the gate by
// a quarter of that plus 4 units; h' = h + g · value by Δg |value| + 2 units of |h| + |g value|,
// and rounds to bf16.
TEST(GradEngram, GateForwardMatchesTheCpuOp) {
  const int64_t hc = 4, d = 128;
  const std::vector<float> Xf = test::bf16_normal(size_t(hc * d), 1.0, 8), kvf = test::bf16_normal(size_t((hc + 1) * d), 1.0, 9);
  const std::vector<float> qf = test::bf16_normal(size_t(hc * d), 1.0, 10), kf = test::bf16_normal(size_t(hc * d), 1.0, 11);
  std::vector<float> qk(size_t(hc * d)), out_cpu = Xf;
  for (size_t i = 0; i < qk.size(); ++i) qk[i] = qf[i] * kf[i];
  engram_gate(out_cpu.data(), kvf.data(), qk.data(), int(hc), d, float(kNormEps));
  const std::vector<double> X(Xf.begin(), Xf.end()), kv(kvf.begin(), kvf.end()), q(qf.begin(), qf.end()), k(kf.begin(), kf.end());
  std::vector<double> out(X.size());
  grad::EngramGateSaved<double> saved;
  grad::engram_gate_forward(X.data(), kv.data(), q.data(), k.data(), 1, int(hc), d, kNormEps, out.data(), saved);
  for (int64_t m = 0; m < hc; ++m) {
    double mag = 0;
    for (int64_t i = 0; i < d; ++i) mag += std::fabs(X[size_t(m * d + i)] * q[size_t(m * d + i)] * k[size_t(m * d + i)] * kv[size_t(m * d + i)]);
    const double dot = saved.dot[size_t(m)];
    ASSERT_GT(std::fabs(dot), 1e-3);
    const double ddot = (2 * d + 15) * test::kF32Unit * mag * saved.rh[size_t(m)] * saved.rk[size_t(m)] / std::sqrt(double(d));
    const double dg = ddot / (2 * std::sqrt(std::fabs(dot))) / 4 + 4 * test::kF32Unit;
    const double g = saved.gate[size_t(m)];
    for (int64_t i = 0; i < d; ++i) {
      const double value = kv[size_t(hc * d + i)], v = out[size_t(m * d + i)];
      const double delta = dg * std::fabs(value) + 2 * test::kF32Unit * (std::fabs(X[size_t(m * d + i)]) + std::fabs(g * value));
      EXPECT_NEAR(out_cpu[size_t(m * d + i)], v, delta + 0.5 * test::bf16_ulp(std::fabs(v) + delta)) << m << "," << i;
    }
  }
}

}  // namespace
}  // namespace dsv41
