// The ViT's own ops (src/backend/cpu/vision_rope.h, pixel_unshuffle.h, vision.h; docs/vision.md
// §5-§6): the 2D rotary embedding against hand-worked cases and a double-precision formula, the
// pixel unshuffle against hand-picked entries and a direct transcription of pad + F.unfold, the
// bf16 modules (Linear with bias, SiLU·up, GELU, attention) against double-precision formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/pixel_unshuffle.h"
#include "backend/cpu/vision.h"
#include "backend/cpu/vision_rope.h"
#include "base/error.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::expect_bf16_of;
using test::make_weight;

// ---- 2D RoPE ---------------------------------------------------------------------------------------

// f_i = theta^(-2i / (head_dim/2)): for the released heads (64 channels) 16 frequencies
// 10000^(-i/16), each within the fp32 steps' rounding (pow, division: a few 2^-24).
TEST(OpsVisionRope, FrequenciesPerAxis) {
  const VisionRope rope(64, 10000.0);
  ASSERT_EQ(rope.frequencies().size(), 16u);
  for (int i = 0; i < 16; ++i) {
    const double want = std::pow(10000.0, -i / 16.0);
    EXPECT_NEAR(rope.frequencies()[size_t(i)], want, want * 4 * test::kF32Unit) << i;
  }
  EXPECT_EQ(rope.frequencies()[0], 1.0f);
}

// head_dim 4: one frequency, f_0 = 1. Channel 0 turns with channel 2 by the row angle, channel 1
// with channel 3 by the column angle. At (row 1, col 2), [1, 0.5, 0, 0.25] becomes
// [cos 1, 0.5 cos 2 - 0.25 sin 2, sin 1, 0.25 cos 2 + 0.5 sin 2], each rounded to bf16.
TEST(OpsVisionRope, HandWorkedHead) {
  const VisionRope rope(4, 10000.0);
  float x[4] = {1.0f, 0.5f, 0.0f, 0.25f};
  rope.apply(x, 1, 1, 2);
  const double want[4] = {std::cos(1.0), 0.5 * std::cos(2.0) - 0.25 * std::sin(2.0), std::sin(1.0),
                          0.25 * std::cos(2.0) + 0.5 * std::sin(2.0)};
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(x[j], want[j], bf16_ulp(want[j])) << j;
    EXPECT_EQ(x[j], round_bf16(x[j])) << j;
  }
}

// At the grid's origin every angle is 0: the heads come back bit for bit.
TEST(OpsVisionRope, OriginIsIdentity) {
  const VisionRope rope(16, 10000.0);
  std::vector<float> x = bf16_normal(3 * 16, 1.0, 7);
  const std::vector<float> before = x;
  rope.apply(x.data(), 3, 0, 0);
  EXPECT_EQ(x, before);
}

// Every head of a patch, at several positions, against the rotation in double (angles from the
// double frequencies). Tolerance: one bf16 ulp of the exact value. The fp32 path errs by a few
// 2^-24 relative in the frequency and the angle (so at most ~40 · 2^-22 rad at position 40), in
// cos/sin and in the two products and the sum: far below bf16's half ulp (2^-9 relative), so the
// op returns bf16(exact) or, near a rounding midpoint, the neighbour; at least 99% must be exact.
TEST(OpsVisionRope, MatchesTheRotationInDouble) {
  const int head_dim = 16, heads = 4, half = head_dim / 2, n = half / 2;
  const double theta = 10000.0;
  const VisionRope rope(head_dim, theta);
  size_t total = 0, exact = 0;
  for (const auto& [row, col] : std::vector<std::pair<int, int>>{{0, 5}, {3, 0}, {7, 11}, {40, 2}, {13, 39}}) {
    std::vector<float> x = bf16_normal(size_t(heads * head_dim), 1.0, uint32_t(100 + row * 64 + col));
    const std::vector<float> in = x;
    rope.apply(x.data(), heads, row, col);
    for (int h = 0; h < heads; ++h)
      for (int j = 0; j < half; ++j) {
        const double angle = (j < n ? row : col) * std::pow(theta, -2.0 * (j % n) / half);
        const double x1 = in[size_t(h * head_dim + j)], x2 = in[size_t(h * head_dim + j + half)];
        const double want[2] = {x1 * std::cos(angle) - x2 * std::sin(angle), x2 * std::cos(angle) + x1 * std::sin(angle)};
        const float got[2] = {x[size_t(h * head_dim + j)], x[size_t(h * head_dim + j + half)]};
        for (int k = 0; k < 2; ++k) {
          ASSERT_NEAR(got[k], want[k], bf16_ulp(want[k])) << "(" << row << "," << col << ") head " << h << " pair " << j;
          ++total;
          exact += got[k] == round_bf16(float(want[k]));
        }
      }
  }
  EXPECT_GE(double(exact), 0.99 * double(total));
}

TEST(OpsVisionRope, RefusesHeadsThatDoNotSplitInFour) {
  EXPECT_THROW(VisionRope(18, 10000.0), Error);
  EXPECT_THROW(VisionRope(0, 10000.0), Error);
}

// ---- pixel unshuffle -------------------------------------------------------------------------------

// pad + F.unfold as torch defines them: the [dim, n_h, n_w] map zero-padded to multiples of r,
// then column L = I·out_w + J of unfold holds padded[c][r·I + ki][r·J + kj] at row c·r² + ki·r + kj.
std::vector<float> unfold_naive(const std::vector<float>& x, int n_h, int n_w, int dim, int r) {
  const int ph = (n_h + r - 1) / r * r, pw = (n_w + r - 1) / r * r, out_w = pw / r;
  std::vector<float> padded(size_t(dim * ph * pw), 0.0f);
  for (int y = 0; y < n_h; ++y)
    for (int xx = 0; xx < n_w; ++xx)
      for (int c = 0; c < dim; ++c) padded[size_t((c * ph + y) * pw + xx)] = x[size_t((y * n_w + xx) * dim + c)];
  const int rows = dim * r * r, columns = (ph / r) * out_w;
  std::vector<float> unfolded(size_t(rows * columns));
  for (int c = 0; c < dim; ++c)
    for (int ki = 0; ki < r; ++ki)
      for (int kj = 0; kj < r; ++kj)
        for (int L = 0; L < columns; ++L)
          unfolded[size_t((c * r * r + ki * r + kj) * columns + L)] =
              padded[size_t((c * ph + r * (L / out_w) + ki) * pw + r * (L % out_w) + kj)];
  std::vector<float> tokens(unfolded.size());  // .transpose(0, 1): [columns, rows]
  for (int f = 0; f < rows; ++f)
    for (int L = 0; L < columns; ++L) tokens[size_t(L * rows + f)] = unfolded[size_t(f * columns + L)];
  return tokens;
}

// A 4 x 5 grid of 2-channel patches, patch (y, x) channel c = 100y + 10x + c + 1 (no zeros), r = 3:
// 2 x 2 tokens of 18 features. Token (1, 1) reads rows 3-5, columns 3-5: only (3, 3) and (3, 4)
// exist; feature c·9 + dy·3 + dx.
TEST(OpsPixelUnshuffle, HandPickedEntriesAndZeroPadding) {
  const int n_h = 4, n_w = 5, dim = 2, r = 3;
  std::vector<float> x(size_t(n_h * n_w * dim));
  for (int y = 0; y < n_h; ++y)
    for (int xx = 0; xx < n_w; ++xx)
      for (int c = 0; c < dim; ++c) x[size_t((y * n_w + xx) * dim + c)] = float(100 * y + 10 * xx + c + 1);
  std::vector<float> out(4 * 18, -1.0f);
  pixel_unshuffle(x.data(), n_h, n_w, dim, r, out.data());
  auto at = [&](int I, int J, int c, int dy, int dx) { return out[size_t((I * 2 + J) * 18 + c * 9 + dy * 3 + dx)]; };
  EXPECT_EQ(at(0, 0, 0, 0, 0), 1.0f);    // patch (0, 0), channel 0
  EXPECT_EQ(at(0, 0, 1, 2, 1), 212.0f);  // patch (2, 1), channel 1
  EXPECT_EQ(at(0, 1, 0, 1, 1), 141.0f);  // patch (1, 4)
  EXPECT_EQ(at(0, 1, 0, 1, 2), 0.0f);    // column 5: padding
  EXPECT_EQ(at(1, 1, 0, 0, 0), 331.0f);  // patch (3, 3)
  EXPECT_EQ(at(1, 1, 1, 0, 1), 342.0f);  // patch (3, 4), channel 1
  EXPECT_EQ(at(1, 1, 0, 0, 2), 0.0f);    // column 5: padding
  EXPECT_EQ(at(1, 0, 1, 1, 0), 0.0f);    // row 4: padding
  EXPECT_EQ(unfold_naive(x, n_h, n_w, dim, r), out);
}

// The released shapes' proportions on a larger grid: 13 x 8 patches of 5 channels (neither side a
// multiple of 3), against the transcription of pad + unfold.
TEST(OpsPixelUnshuffle, MatchesPadAndUnfold) {
  const int n_h = 13, n_w = 8, dim = 5, r = 3;
  const std::vector<float> x = bf16_normal(size_t(n_h * n_w * dim), 1.0, 9);
  std::vector<float> out(size_t(5 * 3 * dim * r * r));
  pixel_unshuffle(x.data(), n_h, n_w, dim, r, out.data());
  EXPECT_EQ(unfold_naive(x, n_h, n_w, dim, r), out);
}

// ---- the bf16 modules ------------------------------------------------------------------------------

// bf16(x·Wᵀ + b) over bf16 weights and bias, against the sum in double; and without a bias.
TEST(OpsVisionModules, LinearWithBias) {
  const int M = 5, N = 24, K = 40;
  const std::vector<float> x = bf16_normal(size_t(M * K), 1.0, 11);
  const test::OwnedWeight w = make_weight(WeightFormat::BF16, bf16_normal(size_t(N * K), 0.2, 12), N, K);
  const test::OwnedWeight b = make_weight(WeightFormat::BF16, bf16_normal(size_t(N), 1.0, 13), 1, N);
  for (const bool with_bias : {true, false}) {
    std::vector<float> y(size_t(M * N));
    const Weight bias = b.view();
    linear_bias(x.data(), M, w.view(), with_bias ? &bias : nullptr, y.data());
    std::vector<double> exact(y.size());
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double sum = with_bias ? b.at(0, n) : 0.0;
        for (int k = 0; k < K; ++k) sum += double(x[size_t(m * K + k)]) * w.at(n, k);
        exact[size_t(m * N + n)] = sum;
      }
    expect_bf16_of(y, exact, with_bias ? "with bias" : "without bias");
  }
}

// Two roundings, as torch: bf16(silu(gate)), then bf16 of its product with up. The expected value
// takes the first rounding from double; the two agree except where silu lies within fp32's error of
// a bf16 midpoint (then the product may differ by an ulp, within the tolerance).
TEST(OpsVisionModules, SiluTimesUp) {
  const int M = 3, inter = 50;
  const std::vector<float> gu = bf16_normal(size_t(M * 2 * inter), 2.0, 14);
  std::vector<float> out(size_t(M * inter));
  silu_mul(gu.data(), M, inter, out.data());
  std::vector<double> exact(out.size());
  for (int m = 0; m < M; ++m)
    for (int i = 0; i < inter; ++i) {
      const double g = gu[size_t(m * 2 * inter + i)], up = gu[size_t(m * 2 * inter + inter + i)];
      exact[size_t(m * inter + i)] = double(round_bf16(float(g / (1 + std::exp(-g))))) * up;
    }
  expect_bf16_of(out, exact, "silu * up");
}

// The exact (erf) GELU: gelu(1) = 0.841345 -> bf16 0.83984375 (the spacing there is 2^-8),
// gelu(-1) = -0.158655 -> -0.158203125 (spacing 2^-10), gelu(0) = 0; and random values against
// x/2 · (1 + erf(x/√2)) in double.
TEST(OpsVisionModules, ExactGelu) {
  std::vector<float> hand = {1.0f, -1.0f, 0.0f};
  gelu(hand.data(), 3);
  EXPECT_EQ(hand[0], 0.83984375f);
  EXPECT_EQ(hand[1], -0.158203125f);
  EXPECT_EQ(hand[2], 0.0f);
  std::vector<float> x = bf16_normal(400, 2.0, 15);
  std::vector<double> exact(x.size());
  for (size_t i = 0; i < x.size(); ++i) exact[i] = 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0)));
  gelu(x.data(), int64_t(x.size()));
  expect_bf16_of(x, exact, "gelu");
}

// softmax(q·kᵀ/√d)·v per head over all the patches, in double. 70 patches: two query blocks of
// the op, the second partial. Scores of size up to ~6 make the softmax far from uniform.
TEST(OpsVisionModules, FullAttentionPerHead) {
  const int n = 70, heads = 4, hd = 16, width = heads * hd;
  const std::vector<float> qkv = bf16_normal(size_t(n * 3 * width), 1.0, 16);
  std::vector<float> o(size_t(n * width));
  vision_attention(qkv.data(), n, heads, hd, o.data());
  std::vector<double> exact(o.size());
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i) {
      std::vector<double> p(static_cast<size_t>(n));
      double top = -INFINITY, sum = 0;
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int d = 0; d < hd; ++d) s += double(qkv[size_t(i * 3 * width + h * hd + d)]) * qkv[size_t(j * 3 * width + width + h * hd + d)];
        p[size_t(j)] = s / std::sqrt(double(hd));
        top = std::max(top, p[size_t(j)]);
      }
      for (double& v : p) sum += v = std::exp(v - top);
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (int j = 0; j < n; ++j) acc += p[size_t(j)] * qkv[size_t(j * 3 * width + 2 * width + h * hd + d)];
        exact[size_t(i * width + h * hd + d)] = acc / sum;
      }
    }
  expect_bf16_of(o, exact, "attention");
}

}  // namespace
}  // namespace dsv41
