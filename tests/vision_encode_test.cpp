// The vision tower on the CPU (forward/vision_network.h over forward/vision_cpu.cpp's op set;
// docs/vision.md §5-§6): the fixture's shapes (2 blocks, dim 64, 4 heads, patch 14, 3x3 aligner
// into dim 128) with seeded random weights, against a plain double-precision transcription of
// vision.py written here that rounds to bf16 where the reference's bf16 modules do; and the
// independence of each image's result from the others encoded with it. Parity with the reference
// itself waits for the v41-tiny-vision fixture.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "forward/vision_cpu.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_uniform;
using test::make_weight;
using test::OwnedWeight;

Config tiny_vision_config() {
  Config c;
  c.dim = 128;
  c.vision = VisionConfig{2, 64, 4, 96, 14, 10000.0, 3, 64, 3136, std::nullopt};
  return c;
}

// Weights a test owns, and the VisionWeights views of them.
struct TestTower {
  std::vector<OwnedWeight> owned;
  VisionWeights w;

  // A bf16 [rows, cols] matrix with entries of standard deviation 1/√cols (gains near 1).
  Weight matrix(int rows, int cols, uint32_t seed) {
    owned.push_back(make_weight(WeightFormat::BF16, bf16_normal(size_t(rows * cols), 1.0 / std::sqrt(cols), seed), rows, cols));
    return owned.back().view();
  }
  Weight vector(int n, double stddev, double mean, WeightFormat format, uint32_t seed) {
    std::vector<float> v = bf16_normal(size_t(n), stddev, seed);
    for (float& x : v) x = round_bf16(float(x + mean));
    owned.push_back(make_weight(format, v, 1, n));
    return owned.back().view();
  }

  explicit TestTower(const Config& c) {
    owned.reserve(64);  // views point into the owned buffers: no reallocation
    const VisionConfig& v = c.vision;
    const int vd = v.dim, patch = 3 * v.patch_size * v.patch_size, r2 = v.downsample_ratio * v.downsample_ratio;
    uint32_t seed = 100;
    w.patch_embed = matrix(vd, patch, seed++);
    w.patch_embed_bias = vector(vd, 0.1, 0, WeightFormat::BF16, seed++);
    for (int b = 0; b < v.n_layers; ++b) {
      VisionBlockWeights k;
      k.norm1 = vector(vd, 0.1, 1, WeightFormat::F32, seed++);
      k.wqkv = matrix(3 * vd, vd, seed++);
      k.wqkv_bias = vector(3 * vd, 0.1, 0, WeightFormat::BF16, seed++);
      k.wo = matrix(vd, vd, seed++);
      k.wo_bias = vector(vd, 0.1, 0, WeightFormat::BF16, seed++);
      k.norm2 = vector(vd, 0.1, 1, WeightFormat::F32, seed++);
      k.w1 = matrix(2 * v.inter_dim, vd, seed++);
      k.w2 = matrix(vd, v.inter_dim, seed++);
      w.blocks.push_back(k);
    }
    w.norm = vector(vd, 0.1, 1, WeightFormat::F32, seed++);
    w.aligner_w1 = matrix(c.dim, vd * r2, seed++);
    w.aligner_w1_bias = vector(c.dim, 0.1, 0, WeightFormat::BF16, seed++);
    w.aligner_w2 = matrix(c.dim, c.dim, seed++);
    w.aligner_w2_bias = vector(c.dim, 0.1, 0, WeightFormat::BF16, seed++);
  }
};

// Normalised pixel levels, as bf16 bits: uniform in [-1, 1].
std::vector<uint16_t> random_patches(int n_h, int n_w, uint32_t seed) {
  const std::vector<float> v = bf16_uniform(size_t(n_h * n_w * 3 * 14 * 14), -1.0, 1.0, seed);
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) bits[i] = bf16_from_float(v[i]);
  return bits;
}

// ---- vision.py in double, rounded to bf16 where its bf16 modules round --------------------------

using Rows = std::vector<double>;  // [n, cols]

double bf(double x) { return round_bf16(float(x)); }

Rows linear(const Rows& x, int n, const Weight& w, const Weight* b) {
  Rows y(size_t(n * w.rows));
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < w.rows; ++o) {
      double s = b ? b->at(0, o) : 0.0;
      for (int k = 0; k < w.cols; ++k) s += x[size_t(i * w.cols + k)] * w.at(o, k);
      y[size_t(i * w.rows + o)] = bf(s);
    }
  return y;
}

Rows norm(const Rows& x, int n, int d, const Weight& w) {
  Rows y(x.size());
  for (int i = 0; i < n; ++i) {
    double ss = 0;
    for (int k = 0; k < d; ++k) ss += x[size_t(i * d + k)] * x[size_t(i * d + k)];
    const double inv = 1 / std::sqrt(ss / d + 1e-6);
    for (int k = 0; k < d; ++k) y[size_t(i * d + k)] = bf(w.at(0, k) * x[size_t(i * d + k)] * inv);
  }
  return y;
}

Rows encode_naive(const Config& c, const VisionWeights& w, const std::vector<uint16_t>& patches, int n_h, int n_w) {
  const VisionConfig& v = c.vision;
  const int n = n_h * n_w, vd = v.dim, H = v.n_heads, hd = vd / H, half = hd / 2, per_axis = half / 2, r = v.downsample_ratio;
  Rows p(patches.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = bf16_to_float(patches[i]);
  Rows x = linear(p, n, w.patch_embed, &w.patch_embed_bias);
  for (const VisionBlockWeights& k : w.blocks) {
    Rows qkv = linear(norm(x, n, vd, k.norm1), n, k.wqkv, &k.wqkv_bias);
    for (int i = 0; i < n; ++i)  // 2D RoPE, rotate half: the row's angles, then the column's
      for (int part = 0; part < 2; ++part)
        for (int h = 0; h < H; ++h) {
          double* head = &qkv[size_t(i * 3 * vd + part * vd + h * hd)];
          for (int j = 0; j < half; ++j) {
            const double angle = (j < per_axis ? i / n_w : i % n_w) * std::pow(v.rope_theta, -2.0 * (j % per_axis) / half);
            const double x1 = head[j], x2 = head[j + half];
            head[j] = bf(x1 * std::cos(angle) - x2 * std::sin(angle));
            head[j + half] = bf(x2 * std::cos(angle) + x1 * std::sin(angle));
          }
        }
    Rows o(size_t(n * vd));
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < n; ++i) {
        std::vector<double> s(static_cast<size_t>(n));
        double top = -INFINITY, sum = 0;
        for (int j = 0; j < n; ++j) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += qkv[size_t(i * 3 * vd + h * hd + d)] * qkv[size_t(j * 3 * vd + vd + h * hd + d)];
          top = std::max(top, s[size_t(j)] = dot / std::sqrt(double(hd)));
        }
        for (double& e : s) sum += e = std::exp(e - top);
        for (int d = 0; d < hd; ++d) {
          double acc = 0;
          for (int j = 0; j < n; ++j) acc += s[size_t(j)] * qkv[size_t(j * 3 * vd + 2 * vd + h * hd + d)];
          o[size_t(i * vd + h * hd + d)] = bf(acc / sum);
        }
      }
    const Rows a = linear(o, n, k.wo, &k.wo_bias);
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf(x[i] + a[i]);
    const Rows gu = linear(norm(x, n, vd, k.norm2), n, k.w1, nullptr);
    Rows g(size_t(n * v.inter_dim));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < v.inter_dim; ++j) {
        const double gate = gu[size_t(i * 2 * v.inter_dim + j)], up = gu[size_t(i * 2 * v.inter_dim + v.inter_dim + j)];
        g[size_t(i * v.inter_dim + j)] = bf(bf(gate / (1 + std::exp(-gate))) * up);
      }
    const Rows m = linear(g, n, k.w2, nullptr);
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf(x[i] + m[i]);
  }
  x = norm(x, n, vd, w.norm);
  // Pixel unshuffle: token (I, J) takes the r x r block, feature c·r² + dy·r + dx, zeros past the grid.
  const int th = (n_h + r - 1) / r, tw = (n_w + r - 1) / r, f = vd * r * r;
  Rows t(size_t(th * tw * f), 0.0);
  for (int I = 0; I < th; ++I)
    for (int J = 0; J < tw; ++J)
      for (int dy = 0; dy < r; ++dy)
        for (int dx = 0; dx < r; ++dx)
          if (r * I + dy < n_h && r * J + dx < n_w)
            for (int ch = 0; ch < vd; ++ch)
              t[size_t((I * tw + J) * f + ch * r * r + dy * r + dx)] = x[size_t(((r * I + dy) * n_w + r * J + dx) * vd + ch)];
  Rows hidden = linear(t, th * tw, w.aligner_w1, &w.aligner_w1_bias);
  for (double& e : hidden) e = bf(0.5 * e * (1 + std::erf(e / std::sqrt(2.0))));
  return linear(hidden, th * tw, w.aligner_w2, &w.aligner_w2_bias);
}

// The fixture's two grids (image0: 5 x 8 patches, 2 x 3 tokens; image1: 10 x 7 patches, 4 x 3
// tokens). Tolerance: both sides round to bf16 at the same points, the op from fp32 arithmetic in
// its own summation order, the transcription from double. Where a value lies within fp32's error
// of a bf16 midpoint the two round it one ulp apart, and the network carries that flip into every
// later value: with these seeds image0 comes out bit for bit equal, while image1 has one such value
// in the first norm1 (of 2560) and ends with a mean difference of 1.2 ulps of the output's RMS, 7 at
// most (measured). Bounds: every element within 16 ulps of the RMS (2^-4), the mean within 4
// (2^-6). A real error (a wrong RoPE pairing, unshuffle order or bias) moves outputs by O(RMS).
TEST(VisionEncode, MatchesADoubleTranscriptionOfVisionPy) {
  const Config c = tiny_vision_config();
  const TestTower tower(c);
  const std::vector<uint16_t> a = random_patches(5, 8, 1), b = random_patches(10, 7, 2);
  const std::vector<std::vector<float>> out = encode_images(c, tower.w, {{a.data(), 5, 8}, {b.data(), 10, 7}});
  ASSERT_EQ(out.size(), 2u);
  ASSERT_EQ(out[0].size(), size_t(6 * c.dim));
  ASSERT_EQ(out[1].size(), size_t(12 * c.dim));
  const int grids[2][2] = {{5, 8}, {10, 7}};
  for (int im = 0; im < 2; ++im) {
    const Rows want = encode_naive(c, tower.w, im == 0 ? a : b, grids[im][0], grids[im][1]);
    double rms = 0, max_diff = 0, mean_diff = 0;
    for (double e : want) rms += e * e;
    rms = std::sqrt(rms / double(want.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      const double d = std::fabs(out[size_t(im)][i] - want[i]);
      max_diff = std::max(max_diff, d);
      mean_diff += d / double(want.size());
    }
    EXPECT_LE(max_diff, rms * 0x1p-4) << "image " << im << " (rms " << rms << ", mean diff " << mean_diff << ")";
    EXPECT_LE(mean_diff, rms * 0x1p-6) << "image " << im << " (rms " << rms << ", max diff " << max_diff << ")";
  }
}

// Each image attends only to its own patches, turns by its own grid positions and is unshuffled
// on its own grid: encoding images together gives each one's result alone, bit for bit.
TEST(VisionEncode, ImagesEncodedTogetherEqualEachAlone) {
  const Config c = tiny_vision_config();
  const TestTower tower(c);
  const std::vector<uint16_t> a = random_patches(5, 8, 3), b = random_patches(10, 7, 4), d = random_patches(1, 1, 5);
  const auto together = encode_images(c, tower.w, {{a.data(), 5, 8}, {b.data(), 10, 7}, {d.data(), 1, 1}});
  EXPECT_EQ(together[0], encode_images(c, tower.w, {{a.data(), 5, 8}})[0]);
  EXPECT_EQ(together[1], encode_images(c, tower.w, {{b.data(), 10, 7}})[0]);
  EXPECT_EQ(together[2], encode_images(c, tower.w, {{d.data(), 1, 1}})[0]);
  EXPECT_EQ(together[2].size(), size_t(c.dim));  // one patch: one token
}

TEST(VisionEncode, RefusesAConfigWithoutAVisionTower) {
  Config c = tiny_vision_config();
  const TestTower tower(c);
  c.vision.n_layers = 0;
  const std::vector<uint16_t> a = random_patches(1, 1, 6);
  EXPECT_THROW(encode_images(c, tower.w, {{a.data(), 1, 1}}), Error);
  EXPECT_TRUE(encode_images(tiny_vision_config(), tower.w, {}).empty());
}

}  // namespace
}  // namespace dsv41
