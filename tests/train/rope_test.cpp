// src/train/grad/rope.h: the backward (the opposite rotation) against central differences, the
// forward against the CPU op (backend/cpu/rope.h) on the same inputs, and the layout: only the last
// rope_dim values of each head turn.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/rope.h"
#include "gradcheck.h"
#include "train/grad/rope.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

// YaRN on, as on the compressed layers: a ramp between kept and divided frequencies.
RopeTable yarn_table(int rope_dim) { return RopeTable(rope_dim, 40000.0, 64, 4.0, 32, 1); }

TEST(GradRope, GradientMatchesCentralDifferences) {
  const int64_t rows = 3, heads = 2, head_dim = 10, rope_dim = 6;
  const RopeTable table = yarn_table(int(rope_dim));
  const std::vector<int64_t> positions = {0, 5, 1234};
  for (bool inverse : {false, true}) {
    std::vector<double> x = normal_values(size_t(rows * heads * head_dim), 1.0, 1);
    const std::vector<double> c = normal_values(x.size(), 1.0, 2);
    std::vector<double> y;
    auto loss = [&] {
      y = x;
      grad::rope_forward(y.data(), rows, heads, head_dim, rope_dim, positions.data(), table.frequencies().data(), inverse);
      return weighted_sum(c, y);
    };
    std::vector<double> dx = c;
    grad::rope_backward(dx.data(), rows, heads, head_dim, rope_dim, positions.data(), table.frequencies().data(), inverse);
    expect_gradient(inverse ? "dx (inverse)" : "dx", x, dx, loss);
  }
}

TEST(GradRope, TurnsOnlyTheLastRopeDimValuesOfEachHead) {
  const int64_t heads = 2, head_dim = 8, rope_dim = 4;
  const RopeTable table = yarn_table(int(rope_dim));
  const std::vector<int64_t> pos = {7};
  const std::vector<double> x = normal_values(size_t(heads * head_dim), 1.0, 3);
  std::vector<double> y = x;
  grad::rope_forward(y.data(), 1, heads, head_dim, rope_dim, pos.data(), table.frequencies().data(), false);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t k = 0; k < head_dim - rope_dim; ++k) EXPECT_EQ(y[size_t(h * head_dim + k)], x[size_t(h * head_dim + k)]);
    // Pair 0 turns by 7 · freq_0 = 7 rad (freq_0 = 1 in every table).
    const double a = x[size_t(h * head_dim + 4)], b = x[size_t(h * head_dim + 5)];
    EXPECT_NEAR(y[size_t(h * head_dim + 4)], a * std::cos(7.0) - b * std::sin(7.0), 1e-14);
    EXPECT_NEAR(y[size_t(h * head_dim + 5)], a * std::sin(7.0) + b * std::cos(7.0), 1e-14);
  }
}

// The CPU op evaluates the same fp32 angle, cos and sin in fp32 (glibc: within 1 ulp), the two
// products and the difference in fp32, and rounds to bf16. Before that rounding it errs by at most
// δ = 4 fp32 units of |a| + |b| (the cos and sin units times |a|, |b|, two products, one sum), so
// |y_cpu − y| ≤ δ + ½ ulp_bf16(|y| + δ). Positions up to 60000, the angle as large as it gets.
TEST(GradRope, ForwardMatchesTheCpuOp) {
  const int rope_dim = 64;
  const RopeTable table = yarn_table(rope_dim);
  for (int64_t pos : {0, 1, 17, 4095, 60000}) {
    std::vector<float> xf = test::bf16_normal(size_t(rope_dim), 1.0, uint32_t(pos + 4));
    const std::vector<double> x(xf.begin(), xf.end());
    for (bool inverse : {false, true}) {
      std::vector<float> y_cpu = xf;
      table.apply(y_cpu.data(), pos, inverse);
      std::vector<double> y = x;
      grad::rope_forward(y.data(), 1, 1, rope_dim, rope_dim, &pos, table.frequencies().data(), inverse);
      for (int k = 0; k < rope_dim; k += 2) {
        const double delta = 4 * test::kF32Unit * (std::fabs(x[size_t(k)]) + std::fabs(x[size_t(k + 1)]));
        for (int j = k; j < k + 2; ++j)
          EXPECT_NEAR(y_cpu[size_t(j)], y[size_t(j)], delta + 0.5 * test::bf16_ulp(std::fabs(y[size_t(j)]) + delta))
              << "pos " << pos << " value " << j;
      }
    }
  }
}

}  // namespace
}  // namespace dsv41
