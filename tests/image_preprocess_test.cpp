// The reference's image preprocessing (src/model/image/preprocess.h, resample.h; docs/vision.md
// §2-§4, §7): the resize plan, Pillow's bicubic resize, ImageOps.pad, the normalised bf16 levels,
// the patch layout and the span's token types. Expected values are worked out by hand in each
// test, or come from the reference's own plan_image_grid (the tables), or from a double-precision
// resampler written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "model/image/preprocess.h"
#include "model/image/resample.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

// The vision settings of the released model and of the tiny fixture (make_fixtures.py VISION_CONFIG).
VisionConfig released() { return VisionConfig{32, 1024, 16, 2816, 14, 10000.0, 3, 1024, 544 * 544, std::nullopt}; }
VisionConfig tiny() { return VisionConfig{2, 64, 4, 96, 14, 10000.0, 3, 64, 3136, std::nullopt}; }

struct PlanRow {
  int width, height;
  int n_llm_h, n_llm_w, best_height, best_width;  // plan_image_grid's tuple, in its order
};

void expect_plan(const VisionConfig& v, const PlanRow& row, const char* config) {
  const ImagePlan plan = plan_image(row.width, row.height, v);
  const std::string where = std::string(config) + " " + std::to_string(row.width) + "x" + std::to_string(row.height);
  EXPECT_EQ(plan.n_llm_h, row.n_llm_h) << where;
  EXPECT_EQ(plan.n_llm_w, row.n_llm_w) << where;
  EXPECT_EQ(plan.best_height, row.best_height) << where;
  EXPECT_EQ(plan.best_width, row.best_width) << where;
  EXPECT_EQ(plan.n_vit_h * v.patch_size, plan.best_height) << where;
  EXPECT_EQ(plan.n_vit_w * v.patch_size, plan.best_width) << where;
  EXPECT_LE(plan.span_tokens(), v.max_n_token) << where;
}

// ---- the plan -------------------------------------------------------------------------------------

// Worked by hand. Tiny, 112 x 70: 7840 pixels >= 3136, so no upscale; 112 and 70 are multiples of
// 14 (8 x 5 patches); ceil(5/3) x ceil(8/3) = 2 x 3 tokens, span 2·4 + 2 = 10 <= 64.
// Released, 1 x 1: scale = sqrt(295936) = 544, so 544 x 544, rounded up to 546 = 39·14; 13 x 13
// tokens, span 13·14 + 2 = 184. Released, 640 x 480: 644 x 490 (46 x 35 patches), 12 x 16 tokens,
// span 206.
TEST(ImagePlan, HandWorkedCases) {
  expect_plan(tiny(), {112, 70, 2, 3, 70, 112}, "tiny");
  expect_plan(released(), {1, 1, 13, 13, 546, 546}, "released");
  expect_plan(released(), {640, 480, 12, 16, 490, 644}, "released");
  EXPECT_EQ(plan_image(112, 70, tiny()).span_tokens(), 10);
  EXPECT_EQ(plan_image(640, 480, released()).span_tokens(), 206);
  EXPECT_EQ(plan_image(640, 480, released()).patches(), 1610);
}

// plan_image_grid's answers for make_fixtures.py's PLAN_SIZES (every branch: the min_pixels upscale,
// the max_n_token shrink, the very wide and very tall collapses), computed by running the
// reference's own function; the fixture records the same tables (vision.plan.fixture / .released).
TEST(ImagePlan, MatchesTheReferencesTables) {
  const PlanRow tiny_rows[] = {
      {1, 1, 2, 2, 56, 56},         {13, 13, 2, 2, 56, 56},       {14, 14, 2, 2, 56, 56},
      {15, 15, 2, 2, 56, 56},       {20, 30, 2, 2, 70, 56},       {42, 42, 2, 2, 56, 56},
      {56, 56, 2, 2, 56, 56},       {84, 42, 1, 2, 42, 84},       {100, 100, 3, 3, 112, 112},
      {112, 70, 2, 3, 70, 112},     {90, 130, 4, 3, 140, 98},     {300, 200, 5, 8, 210, 308},
      {640, 480, 6, 8, 252, 336},   {480, 640, 8, 6, 336, 252},   {1024, 1024, 7, 7, 294, 294},
      {1920, 1080, 5, 9, 210, 364}, {4000, 3000, 6, 8, 252, 336}, {1000, 20, 1, 24, 28, 1008},
      {20, 1000, 24, 1, 1008, 28},  {3000, 10, 1, 61, 42, 2562},  {10, 3000, 31, 1, 1302, 42},
      {7000, 300, 1, 24, 42, 980},  {300, 7000, 24, 1, 980, 42},
  };
  const PlanRow released_rows[] = {
      {1, 1, 13, 13, 546, 546},          {13, 13, 13, 13, 546, 546},        {14, 14, 13, 13, 546, 546},
      {15, 15, 13, 13, 546, 546},        {20, 30, 16, 11, 672, 448},        {42, 42, 13, 13, 546, 546},
      {56, 56, 13, 13, 546, 546},        {84, 42, 10, 19, 392, 770},        {100, 100, 13, 13, 546, 546},
      {112, 70, 11, 17, 434, 700},       {90, 130, 16, 11, 658, 462},       {300, 200, 11, 16, 448, 672},
      {640, 480, 12, 16, 490, 644},      {480, 640, 16, 12, 644, 490},      {1024, 1024, 25, 25, 1036, 1036},
      {1920, 1080, 23, 41, 966, 1708},   {4000, 3000, 27, 36, 1134, 1512},  {1000, 20, 2, 92, 84, 3850},
      {20, 1000, 92, 2, 3850, 84},       {3000, 10, 1, 225, 42, 9422},      {10, 3000, 225, 1, 9422, 42},
      {7000, 300, 6, 140, 252, 5880},    {300, 7000, 140, 6, 5880, 252},
  };
  for (const PlanRow& row : tiny_rows) expect_plan(tiny(), row, "tiny");
  for (const PlanRow& row : released_rows) expect_plan(released(), row, "released");
}

// vision_max_wh_ratio (unset in the released config). Ratio 2, tiny, 300 x 100: the width is cut
// to 200; 210 x 112 (15 x 8 patches), 3 x 5 tokens. 100 x 10: cut to 20 x 10, below min_pixels:
// scale sqrt(3136/200) = 3.9598, so int(79.2) x int(39.6) = 79 x 39, rounded up to 84 x 42, 1 x 2
// tokens (both also what the reference's function answers).
TEST(ImagePlan, MaxAspectRatioCutsTheWidth) {
  VisionConfig v = tiny();
  v.max_wh_ratio = 2;
  expect_plan(v, {300, 100, 3, 5, 112, 210}, "ratio 2");
  expect_plan(v, {100, 10, 1, 2, 42, 84}, "ratio 2");
}

// With room for no image (max_n_token 2) the reference plans a height of 0 (and Pillow then fails
// to resize); dsv41 refuses at the plan.
TEST(ImagePlan, RefusesWhatTheTokenBudgetCannotHold) {
  VisionConfig v = tiny();
  v.max_n_token = 2;
  try {
    plan_image(112, 70, v);
    ADD_FAILURE() << "planned";
  } catch (const ImageError& e) {
    EXPECT_NE(std::string(e.what()).find("vision_max_n_token 2 can hold"), std::string::npos) << e.what();
  }
}

// ---- Pillow's bicubic resize -----------------------------------------------------------------------

RgbImage grey_row(const std::vector<int>& levels, bool vertical = false) {
  RgbImage image(vertical ? 1 : int(levels.size()), vertical ? int(levels.size()) : 1);
  for (size_t i = 0; i < levels.size(); ++i) {
    uint8_t* p = vertical ? image.at(0, int(i)) : image.at(int(i), 0);
    p[0] = p[1] = p[2] = uint8_t(levels[i]);
  }
  return image;
}

std::vector<int> grey_levels(const RgbImage& image) {
  std::vector<int> out;
  for (size_t i = 0; i < image.pixels.size(); i += 3) {
    EXPECT_EQ(image.pixels[i], image.pixels[i + 1]);
    EXPECT_EQ(image.pixels[i], image.pixels[i + 2]);
    out.push_back(image.pixels[i]);
  }
  return out;
}

// Keys' cubic, a = -0.5.
double keys(double x) {
  x = std::fabs(x);
  if (x < 1) return (1.5 * x - 2.5) * x * x + 1;
  if (x < 2) return ((-0.5 * x + 2.5) * x - 4) * x + 2;
  return 0;
}

// Worked by hand. 4 -> 2 (scale 2: the kernel is stretched to support 4): output 0 is centred at 1.0
// and reads inputs 0..3 at distances (x + 0.5 - 1)/2 = -0.25, 0.25, 0.75, 1.25, weights K = 0.8671875,
// 0.8671875, 0.2265625, -0.0703125 (sum 1.890625); [0, 0, 255, 255] gives 255 · 0.15625 / 1.890625 =
// 21.07 -> 21, and by symmetry 233.93 -> 234. 2 -> 4 (scale 0.5, support 2): centres 0.25, 0.75,
// 1.25, 1.75; [0, 255] gives -22.5 -> 0 (clamped), 52.82 -> 53, 202.18 -> 202, 277.5 -> 255 (clamped).
TEST(ImageResize, HandWorkedRows) {
  EXPECT_EQ(keys(0.25), 0.8671875);
  EXPECT_EQ(keys(0.75), 0.2265625);
  EXPECT_EQ(keys(1.25), -0.0703125);
  EXPECT_EQ(grey_levels(resize_bicubic(grey_row({0, 0, 255, 255}), 2, 1)), (std::vector<int>{21, 234}));
  EXPECT_EQ(grey_levels(resize_bicubic(grey_row({0, 255}), 4, 1)), (std::vector<int>{0, 53, 202, 255}));
  // The same along y (the vertical pass alone).
  EXPECT_EQ(grey_levels(resize_bicubic(grey_row({0, 0, 255, 255}, true), 1, 2)), (std::vector<int>{21, 234}));
  EXPECT_EQ(grey_levels(resize_bicubic(grey_row({0, 255}, true), 1, 4)), (std::vector<int>{0, 53, 202, 255}));
}

// The weights of every output sum to one, and the fixed-point sum keeps a flat image flat: any
// colour, up or down, along either axis.
TEST(ImageResize, KeepsAFlatImageFlat) {
  const int sizes[][4] = {{90, 130, 97, 140}, {640, 480, 644, 483}, {7, 3, 2, 11}, {5, 5, 5, 17}, {33, 1, 4, 1}};
  for (const auto& s : sizes)
    for (int level : {0, 1, 127, 128, 254, 255}) {
      const RgbImage out = resize_bicubic(RgbImage(s[0], s[1], uint8_t(level), uint8_t(255 - level), 64), s[2], s[3]);
      ASSERT_EQ(out.width, s[2]);
      ASSERT_EQ(out.height, s[3]);
      for (size_t i = 0; i < out.pixels.size(); i += 3) {
        ASSERT_EQ(out.pixels[i], level);
        ASSERT_EQ(out.pixels[i + 1], 255 - level);
        ASSERT_EQ(out.pixels[i + 2], 64);
      }
    }
}

// Pillow's taps along one axis in double: weights normalised to sum one, no fixed point.
struct DoubleTaps {
  std::vector<int> first, count;
  std::vector<std::vector<double>> w;
  double max_abs_sum = 0;  // the largest Σ|w| of an output: how much an input error can grow
};

DoubleTaps double_taps(int in, int out) {
  DoubleTaps t;
  const double scale = double(in) / out, fs = std::max(scale, 1.0), support = 2 * fs;
  for (int i = 0; i < out; ++i) {
    const double c = (i + 0.5) * scale;
    const int lo = std::max(int(c - support + 0.5), 0), hi = std::min(int(c + support + 0.5), in);
    std::vector<double> w;
    double sum = 0, abs_sum = 0;
    for (int x = lo; x < hi; ++x) w.push_back(keys((x - c + 0.5) / fs)), sum += w.back();
    for (double& v : w) v /= sum, abs_sum += std::fabs(v);
    t.first.push_back(lo);
    t.count.push_back(hi - lo);
    t.w.push_back(w);
    t.max_abs_sum = std::max(t.max_abs_sum, abs_sum);
  }
  return t;
}

// Against a double-precision resampler with Pillow's taps and its clamped intermediate image (not
// rounded): the 8-bit intermediate errs by at most 1/2 level (plus the 22-bit weights' ~1e-4), the
// vertical pass multiplies that by at most max Σ|w|, and the final rounding adds 1/2. So every
// output is within 0.5 · max Σ|w| + 0.5 + 0.01 of the double value.
TEST(ImageResize, WithinItsRoundingOfADoubleResampler) {
  std::mt19937 rng(5);
  const int cases[][4] = {{90, 130, 97, 140}, {23, 17, 61, 40}, {64, 48, 21, 13}, {40, 40, 97, 11}};
  for (const auto& s : cases) {
    const int w0 = s[0], h0 = s[1], w1 = s[2], h1 = s[3];
    RgbImage image(w0, h0);
    for (int y = 0; y < h0; ++y)  // a smooth gradient in R, noise in G, hard edges in B
      for (int x = 0; x < w0; ++x) {
        uint8_t* p = image.at(x, y);
        p[0] = uint8_t(255 * (x + y) / (w0 + h0 - 2));
        p[1] = uint8_t(rng());
        p[2] = ((x / 5 + y / 5) % 2) ? 255 : 0;
      }
    const DoubleTaps tx = double_taps(w0, w1), ty = double_taps(h0, h1);
    std::vector<double> mid(size_t(w1 * h0 * 3));
    for (int y = 0; y < h0; ++y)
      for (int x = 0; x < w1; ++x)
        for (int c = 0; c < 3; ++c) {
          double v = 0;
          for (int k = 0; k < tx.count[size_t(x)]; ++k) v += tx.w[size_t(x)][size_t(k)] * image.at(tx.first[size_t(x)] + k, y)[c];
          mid[size_t((y * w1 + x) * 3 + c)] = std::clamp(v, 0.0, 255.0);
        }
    const RgbImage out = resize_bicubic(image, w1, h1);
    const double tolerance = 0.5 * ty.max_abs_sum + 0.5 + 0.01;
    for (int y = 0; y < h1; ++y)
      for (int x = 0; x < w1; ++x)
        for (int c = 0; c < 3; ++c) {
          double v = 0;
          for (int k = 0; k < ty.count[size_t(y)]; ++k) v += ty.w[size_t(y)][size_t(k)] * mid[size_t(((ty.first[size_t(y)] + k) * w1 + x) * 3 + c)];
          ASSERT_NEAR(out.at(x, y)[c], std::clamp(v, 0.0, 255.0), tolerance)
              << w0 << "x" << h0 << " -> " << w1 << "x" << h1 << " at " << x << "," << y << " channel " << c;
        }
  }
}

// ---- fitting ---------------------------------------------------------------------------------------

// The fixture's image0 (tiny, 112 x 70) is a multiple of the patch both ways: kept as it is.
TEST(ImageFit, AnImageOfThePlannedSizeIsKept) {
  RgbImage image(112, 70);
  std::mt19937 rng(6);
  for (uint8_t& v : image.pixels) v = uint8_t(rng());
  const ImagePlan plan = plan_image(112, 70, tiny());
  EXPECT_EQ(fit_image(image, plan, tiny()).pixels, image.pixels);
}

// The fixture's image1 (tiny, 90 x 130 -> 98 x 140): 90/130 < 98/140, so the width becomes
// round(90/130 · 140) = round(96.92) = 97, and the 1-column gap puts the image at x = round(0.5) = 0
// (Python rounds halves to even): column 97 is grey.
TEST(ImageFit, PadLetterboxesWithHalvesRoundedToEven) {
  const ImagePlan plan = plan_image(90, 130, tiny());
  ASSERT_EQ(plan.best_width, 98);
  ASSERT_EQ(plan.best_height, 140);
  const RgbImage fitted = fit_image(RgbImage(90, 130, 255, 0, 0), plan, tiny());
  ASSERT_EQ(fitted.width, 98);
  ASSERT_EQ(fitted.height, 140);
  for (int y = 0; y < 140; ++y)
    for (int x = 0; x < 98; ++x) {
      const uint8_t* p = fitted.at(x, y);
      if (x == 97)
        ASSERT_TRUE(p[0] == 127 && p[1] == 127 && p[2] == 127) << x << "," << y;
      else
        ASSERT_TRUE(p[0] == 255 && p[1] == 0 && p[2] == 0) << x << "," << y;
    }
  // Released, 640 x 480 -> 644 x 490: 640/480 > 644/490, so the height becomes round(480/640 · 644)
  // = 483, and the 7-row gap puts the image at y = round(3.5) = 4: rows 0-3 and 487-489 are grey.
  const ImagePlan wide = plan_image(640, 480, released());
  const RgbImage letterboxed = fit_image(RgbImage(640, 480, 10, 20, 30), wide, released());
  for (int y = 0; y < 490; ++y) {
    const bool grey = y < 4 || y >= 487;
    for (int x = 0; x < 644; x += 643) {
      const uint8_t* p = letterboxed.at(x, y);
      ASSERT_EQ(int(p[0]), grey ? 127 : 10) << y;
      ASSERT_EQ(int(p[2]), grey ? 127 : 30) << y;
    }
  }
}

// With vision_max_wh_ratio and an image at least that wide, load_image resizes to the plan without
// keeping the aspect ratio (no grey border): 300 x 100 at ratio 2 -> 210 x 112.
TEST(ImageFit, WideImagesUnderAnAspectLimitAreStretched) {
  VisionConfig v = tiny();
  v.max_wh_ratio = 2;
  const ImagePlan plan = plan_image(300, 100, v);
  const RgbImage fitted = fit_image(RgbImage(300, 100, 40, 50, 60), plan, v);
  ASSERT_EQ(fitted.width, 210);
  ASSERT_EQ(fitted.height, 112);
  for (size_t i = 0; i < fitted.pixels.size(); i += 3) ASSERT_EQ(fitted.pixels[i], 40);
}

// ---- normalisation, patches, span ------------------------------------------------------------------

// bf16((v/255 - 0.5)/0.5): 0 -> -1 (0xBF80), 255 -> 1 (0x3F80). 128: fp32(128/255) - 0.5 is exact,
// times 2 = 0.0039216 = 2^-8 · 1.00392, above the midpoint 1 + 2^-8 between 1 and 1 + 2^-7, so
// it rounds up to 2^-8 · (1 + 2^-7) = 0x3B81; 127 is its negative, 0xBB81.
TEST(ImageNormalize, HandWorkedLevels) {
  EXPECT_EQ(normalized_level(0), 0xBF80);
  EXPECT_EQ(normalized_level(255), 0x3F80);
  EXPECT_EQ(normalized_level(128), 0x3B81);
  EXPECT_EQ(normalized_level(127), 0xBB81);
  EXPECT_EQ(bf16_to_float(0x3B81), 0.003936767578125f);
}

// Every level within half a bf16 ulp of (2v - 255)/255, plus the fp32 steps' rounding (2^-24
// relative, twice): bf16 of the fp32 value, which is within 2^-23 relative of the exact one.
TEST(ImageNormalize, EveryLevelIsTheNearestBf16) {
  for (int v = 0; v < 256; ++v) {
    const double exact = (2.0 * v - 255.0) / 255.0;
    const double got = bf16_to_float(normalized_level(uint8_t(v)));
    int e = 0;
    std::frexp(std::max(std::fabs(exact), 0x1p-126), &e);
    const double half_ulp = std::ldexp(1.0, e - 9);  // bf16 keeps 8 significant bits
    EXPECT_LE(std::fabs(got - exact), half_ulp + std::fabs(exact) * 0x1p-23) << v;
  }
}

// Layout on a 28 x 14 image (1 x 2 patches of 14): patch 1 covers columns 14-27; within a patch,
// channel, then row, then column. Pixel (x, y) holds (x, y, x + y).
TEST(ImagePatches, RowMajorPatchesChannelMajorInside) {
  RgbImage image(28, 14);
  for (int y = 0; y < 14; ++y)
    for (int x = 0; x < 28; ++x) {
      uint8_t* p = image.at(x, y);
      p[0] = uint8_t(x);
      p[1] = uint8_t(y);
      p[2] = uint8_t(x + y);
    }
  ImagePlan plan;
  plan.best_width = 28;
  plan.best_height = 14;
  plan.n_vit_h = 1;
  plan.n_vit_w = 2;
  plan.n_llm_h = plan.n_llm_w = 1;
  const std::vector<uint16_t> patches = image_patches(image, plan, 14);
  ASSERT_EQ(patches.size(), 2u * 3 * 14 * 14);
  const size_t per_patch = 3 * 14 * 14;
  EXPECT_EQ(patches[0], normalized_level(0));                                          // patch 0, R, (0, 0)
  EXPECT_EQ(patches[per_patch + 0 * 196 + 0 * 14 + 5], normalized_level(14 + 5));      // patch 1, R, row 0, col 5
  EXPECT_EQ(patches[per_patch + 1 * 196 + 3 * 14 + 5], normalized_level(3));           // patch 1, G, row 3
  EXPECT_EQ(patches[per_patch + 2 * 196 + 3 * 14 + 5], normalized_level(19 + 3));      // patch 1, B
  EXPECT_EQ(patches[2 * 196 + 13 * 14 + 13], normalized_level(13 + 13));               // patch 0, B, last
}

TEST(ImageSpan, TokenTypesLayTheGridOutRowByRow) {
  const ImagePlan plan = plan_image(112, 70, tiny());  // 2 x 3 tokens
  using T = TokenType;
  const std::vector<TokenType> want = {T::ImageStart, T::Image, T::Image, T::Image, T::ImageNewLine,
                                       T::Image,      T::Image, T::Image, T::ImageNewLine, T::ImageEnd};
  EXPECT_EQ(image_token_types(plan), want);
  EXPECT_EQ(int64_t(want.size()), plan.span_tokens());
  EXPECT_EQ(plan.image_tokens(), 6);
}

}  // namespace
}  // namespace dsv41
