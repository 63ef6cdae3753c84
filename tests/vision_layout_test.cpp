// The host side of the device vision tower (forward/vision_layout.h): the row ranges, the patch
// places that give the 2D RoPE its angles, the pixel unshuffle as a gather table (applied here on
// the host, it must equal backend/cpu/pixel_unshuffle.h bit for bit), and the zero padding of the
// patch embedding's K.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/pixel_unshuffle.h"
#include "base/error.h"
#include "forward/vision_layout.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

// Grids with every kind of edge: exact multiples of r, one past, two past, a single patch, a row.
const std::vector<std::pair<int, int>> kGrids = {{3, 3}, {4, 3}, {5, 7}, {1, 1}, {2, 10}, {6, 6}};

std::vector<VisionImage> images_of(const std::vector<std::pair<int, int>>& grids) {
  std::vector<VisionImage> images;
  static const uint16_t none = 0;  // the layout reads no patch values
  for (auto [h, w] : grids) images.push_back(VisionImage{&none, h, w});
  return images;
}

TEST(VisionLayout, RowRangesAndPlaces) {
  const VisionLayout l = vision_layout(images_of(kGrids), 3);
  int64_t patches = 0, tokens = 0;
  ASSERT_EQ(l.patch_first.size(), kGrids.size() + 1);
  for (size_t i = 0; i < kGrids.size(); ++i) {
    const auto [h, w] = kGrids[i];
    EXPECT_EQ(l.patch_first[i], patches);
    EXPECT_EQ(l.token_first[i], tokens);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        const int64_t row = patches + int64_t(y) * w + x;
        EXPECT_EQ(l.places[size_t(2 * row)], y);
        EXPECT_EQ(l.places[size_t(2 * row + 1)], x);
      }
    patches += int64_t(h) * w;
    tokens += int64_t((h + 2) / 3) * ((w + 2) / 3);
  }
  EXPECT_EQ(l.patches, patches);
  EXPECT_EQ(l.tokens, tokens);
  EXPECT_EQ(l.patch_first.back(), patches);
  EXPECT_EQ(l.token_first.back(), tokens);
  EXPECT_EQ(l.places.size(), size_t(2 * patches));
  EXPECT_EQ(l.unshuffle.size(), size_t(9 * tokens));
}

// The gather the device runs (out[t][c·r² + q] = x[table[t·r² + q]][c], 0 for -1), on all images'
// rows at once, equals pixel_unshuffle image by image, at r = 3 and r = 2.
TEST(VisionLayout, UnshuffleTableIsPixelUnshuffle) {
  for (int r : {3, 2}) {
    const std::vector<VisionImage> images = images_of(kGrids);
    const VisionLayout l = vision_layout(images, r);
    const int64_t dim = 5, rr = int64_t(r) * r;
    std::vector<float> x(size_t(l.patches * dim));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(i) + 0.5f;  // every value distinct and nonzero
    std::vector<float> gathered(size_t(l.tokens * dim * rr));
    for (int64_t t = 0; t < l.tokens; ++t)
      for (int64_t c = 0; c < dim; ++c)
        for (int64_t q = 0; q < rr; ++q) {
          const int32_t src = l.unshuffle[size_t(t * rr + q)];
          gathered[size_t((t * dim + c) * rr + q)] = src < 0 ? 0.0f : x[size_t(src * dim + c)];
        }
    for (size_t i = 0; i < images.size(); ++i) {
      const int64_t n = l.token_first[i + 1] - l.token_first[i];
      std::vector<float> want(size_t(n * dim * rr));
      pixel_unshuffle(x.data() + l.patch_first[i] * dim, images[i].n_vit_h, images[i].n_vit_w, dim, r, want.data());
      const std::vector<float> got(gathered.begin() + l.token_first[i] * dim * rr, gathered.begin() + l.token_first[i + 1] * dim * rr);
      EXPECT_EQ(got, want) << "r " << r << " image " << i;
    }
  }
}

TEST(VisionLayout, PaddedPatchesAndWeight) {
  EXPECT_EQ(padded_columns(588), 592);
  EXPECT_EQ(padded_columns(64), 64);
  EXPECT_EQ(padded_columns(1), 8);
  // Two images of 2 and 3 patches of 3 values each, padded to 8 columns.
  std::vector<uint16_t> a, b;
  for (int i = 0; i < 6; ++i) a.push_back(bf16_from_float(float(i + 1)));
  for (int i = 0; i < 9; ++i) b.push_back(bf16_from_float(-float(i + 1)));
  const std::vector<float> s = stacked_patches({VisionImage{a.data(), 1, 2}, VisionImage{b.data(), 3, 1}}, 3, 8);
  ASSERT_EQ(s.size(), size_t(5 * 8));
  for (int row = 0; row < 5; ++row)
    for (int k = 0; k < 8; ++k) {
      const float want = k >= 3 ? 0.0f : row < 2 ? float(row * 3 + k + 1) : -float((row - 2) * 3 + k + 1);
      EXPECT_EQ(s[size_t(row * 8 + k)], want) << row << ", " << k;
    }
  const std::vector<uint16_t> w = pad_columns(a.data(), 2, 3, 8);
  EXPECT_EQ(w, (std::vector<uint16_t>{a[0], a[1], a[2], 0, 0, 0, 0, 0, a[3], a[4], a[5], 0, 0, 0, 0, 0}));
  EXPECT_THROW(pad_columns(a.data(), 2, 3, 2), Error);
  EXPECT_THROW(stacked_patches({VisionImage{a.data(), 1, 2}}, 3, 2), Error);
  EXPECT_THROW(vision_layout({VisionImage{a.data(), 0, 2}}, 3), Error);
}

}  // namespace
}  // namespace dsv41
