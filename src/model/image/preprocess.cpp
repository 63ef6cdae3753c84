#include "model/image/preprocess.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "model/image/resample.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

// Every step below is a double operation in the reference's order: Python's int / int is the
// correctly rounded quotient, as double(a) / double(b) is for the magnitudes here (< 2^53).

int64_t ceil_div_as_python(int64_t a, int64_t b) { return int64_t(std::ceil(double(a) / double(b))); }

struct Grid {
  int64_t h, w;
};

// llm_grid: the aligner's token grid for a fitted size.
Grid llm_grid(int64_t best_height, int64_t best_width, int p, int r) {
  return {ceil_div_as_python(best_height / p, r), ceil_div_as_python(best_width / p, r)};
}

int64_t span_tokens(Grid g) { return g.h * (g.w + 1) + 2; }

struct Size {
  int64_t height, width;
};

// solve_resize_ratio: the largest aspect-preserving size whose span fits in max_n_token.
Size solve_resize_ratio(int64_t height, int64_t width, int p, int r, int64_t max_n_token) {
  const double ratio = double(height) / double(width);
  const double max_w = std::sqrt(double(max_n_token - 2) / ratio + 0.25) - 0.5;
  const double max_h = max_w * ratio;
  const int64_t cell = int64_t(p) * r;
  if (max_w < 1.0) return {(max_n_token - 2) / 2 * cell, cell};  // very tall: one column
  if (max_h < 1.0) return {cell, (max_n_token - 3) * cell};      // very wide: one row
  const double beta = std::min(double(int64_t(std::floor(max_w)) * cell) / double(width),
                               double(int64_t(std::floor(max_h)) * cell) / double(height));
  return {int64_t(std::floor(double(height) * beta / p)) * p, int64_t(std::floor(double(width) * beta / p)) * p};
}

// Python's round() of a double: to the nearest integer, halves to even.
int64_t round_half_even(double x) {
  const double down = std::floor(x);
  const double rest = x - down;
  int64_t n = int64_t(down);
  if (rest > 0.5 || (rest == 0.5 && n % 2 != 0)) ++n;
  return n;
}

// `image` pasted onto `canvas` with its top-left corner at (x, y), clipped to the canvas.
void paste(const RgbImage& image, int x, int y, RgbImage& canvas) {
  for (int row = std::max(0, -y); row < image.height && y + row < canvas.height; ++row) {
    const int col0 = std::max(0, -x), col1 = std::min(image.width, canvas.width - x);
    if (col1 <= col0) return;
    std::copy(image.at(col0, row), image.at(col0, row) + size_t(col1 - col0) * 3, canvas.at(x + col0, y + row));
  }
}

// ImageOps.pad(image, (width, height), BICUBIC, color=grey, centering=(0.5, 0.5)): contain() then,
// if that left a gap, a paste onto a grey canvas.
RgbImage pad(const RgbImage& image, int width, int height) {
  constexpr uint8_t kGrey = 127;
  // contain(): the largest size of the image's aspect ratio inside (width, height).
  int fit_w = width, fit_h = height;
  const double image_ratio = double(image.width) / double(image.height);
  const double target_ratio = double(width) / double(height);
  if (image_ratio != target_ratio) {
    if (image_ratio > target_ratio)
      fit_h = int(round_half_even(double(image.height) / double(image.width) * width));
    else
      fit_w = int(round_half_even(double(image.width) / double(image.height) * height));
  }
  if (fit_w < 1 || fit_h < 1)
    throw ImageError("image: expected an aspect ratio that fits " + std::to_string(width) + " x " +
                     std::to_string(height) + ", found " + std::to_string(image.width) + " x " +
                     std::to_string(image.height) + " (it would shrink to " + std::to_string(fit_w) + " x " +
                     std::to_string(fit_h) + ")");
  RgbImage fitted = resize_bicubic(image, fit_w, fit_h);
  if (fit_w == width && fit_h == height) return fitted;
  RgbImage canvas(width, height, kGrey, kGrey, kGrey);
  if (fit_w != width)
    paste(fitted, int(round_half_even((width - fit_w) * 0.5)), 0, canvas);
  else
    paste(fitted, 0, int(round_half_even((height - fit_h) * 0.5)), canvas);
  return canvas;
}

}  // namespace

ImagePlan plan_image(int width, int height, const VisionConfig& v) {
  if (width < 1 || height < 1)
    throw ImageError("image: expected at least 1 x 1 pixels, found " + std::to_string(width) + " x " +
                     std::to_string(height));
  const int p = v.patch_size, r = v.downsample_ratio;
  int64_t w = width, h = height;
  if (v.max_wh_ratio && w > h * *v.max_wh_ratio) w = h * *v.max_wh_ratio;
  if (w * h < v.min_pixels) {
    // Python's `x ** 0.5` is C's pow (CPython's float_pow), not sqrt: the same libm call here.
    const double scale = std::pow(double(v.min_pixels) / double(w * h), 0.5);
    w = int64_t(double(w) * scale);
    h = int64_t(double(h) * scale);
  }
  int64_t best_w = ceil_div_as_python(w, p) * p, best_h = ceil_div_as_python(h, p) * p;
  Grid grid = llm_grid(best_h, best_w, p, r);
  if (span_tokens(grid) > v.max_n_token) {
    const Size s = solve_resize_ratio(h, w, p, r, v.max_n_token);
    best_h = s.height;
    best_w = s.width;
    grid = llm_grid(best_h, best_w, p, r);
  }
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (span_tokens(grid) > v.max_n_token || best_w < p || best_h < p || best_w > kIntMax || best_h > kIntMax)
    throw ImageError("image: expected a size that vision_max_n_token " + std::to_string(v.max_n_token) +
                     " can hold, found " + std::to_string(width) + " x " + std::to_string(height) + " (planned " +
                     std::to_string(best_w) + " x " + std::to_string(best_h) + ", " +
                     std::to_string(span_tokens(grid)) + " tokens)");
  ImagePlan plan;
  plan.best_width = int(best_w);
  plan.best_height = int(best_h);
  plan.n_vit_h = int(best_h / p);
  plan.n_vit_w = int(best_w / p);
  plan.n_llm_h = int(grid.h);
  plan.n_llm_w = int(grid.w);
  return plan;
}

RgbImage fit_image(const RgbImage& image, const ImagePlan& plan, const VisionConfig& v) {
  if (v.max_wh_ratio && int64_t(image.width) >= int64_t(*v.max_wh_ratio) * image.height)
    return resize_bicubic(image, plan.best_width, plan.best_height);
  return pad(image, plan.best_width, plan.best_height);
}

uint16_t normalized_level(uint8_t v) {
  const float x = float(v) / 255.0f;
  return bf16_from_float((x - 0.5f) / 0.5f);
}

std::vector<uint16_t> image_patches(const RgbImage& fitted, const ImagePlan& plan, int patch_size) {
  const int p = patch_size;
  if (fitted.width != plan.best_width || fitted.height != plan.best_height || plan.n_vit_w * p != fitted.width ||
      plan.n_vit_h * p != fitted.height)
    throw ImageError("image patches: expected a " + std::to_string(plan.n_vit_w * p) + " x " +
                     std::to_string(plan.n_vit_h * p) + " image, found " + std::to_string(fitted.width) + " x " +
                     std::to_string(fitted.height));
  std::array<uint16_t, 256> level{};
  for (int i = 0; i < 256; ++i) level[size_t(i)] = normalized_level(uint8_t(i));
  const int64_t per_patch = 3LL * p * p;
  std::vector<uint16_t> out(size_t(plan.patches() * per_patch));
  for (int ph = 0; ph < plan.n_vit_h; ++ph)
    for (int pw = 0; pw < plan.n_vit_w; ++pw) {
      uint16_t* patch = out.data() + (int64_t(ph) * plan.n_vit_w + pw) * per_patch;
      for (int c = 0; c < 3; ++c)
        for (int y = 0; y < p; ++y)
          for (int x = 0; x < p; ++x) patch[(c * p + y) * p + x] = level[fitted.at(pw * p + x, ph * p + y)[c]];
    }
  return out;
}

std::vector<TokenType> image_token_types(const ImagePlan& plan) {
  std::vector<TokenType> types;
  types.reserve(size_t(plan.span_tokens()));
  types.push_back(TokenType::ImageStart);
  for (int row = 0; row < plan.n_llm_h; ++row) {
    types.insert(types.end(), size_t(plan.n_llm_w), TokenType::Image);
    types.push_back(TokenType::ImageNewLine);
  }
  types.push_back(TokenType::ImageEnd);
  return types;
}

}  // namespace dsv41
