#include "forward/vision_layout.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "numerics/types.h"

namespace dsv41 {

VisionLayout vision_layout(const std::vector<VisionImage>& images, int r) {
  if (r < 1) fail("vision_layout", "a downsample ratio of at least 1", std::to_string(r));
  VisionLayout l;
  for (const VisionImage& im : images) {
    if (im.n_vit_h < 1 || im.n_vit_w < 1)
      fail("vision_layout", "images of at least one patch", std::to_string(im.n_vit_h) + " x " + std::to_string(im.n_vit_w));
    l.patch_first.push_back(l.patches);
    l.token_first.push_back(l.tokens);
    for (int y = 0; y < im.n_vit_h; ++y)
      for (int x = 0; x < im.n_vit_w; ++x) l.places.insert(l.places.end(), {y, x});
    // Token (I, J), row-major over ceil(n_h/r) × ceil(n_w/r), gathers the r × r block of patches at
    // rows r·I + dy, columns r·J + dx (pixel_unshuffle's order).
    const int out_h = (im.n_vit_h + r - 1) / r, out_w = (im.n_vit_w + r - 1) / r;
    for (int I = 0; I < out_h; ++I)
      for (int J = 0; J < out_w; ++J)
        for (int dy = 0; dy < r; ++dy)
          for (int dx = 0; dx < r; ++dx) {
            const int y = r * I + dy, x = r * J + dx;
            l.unshuffle.push_back(y < im.n_vit_h && x < im.n_vit_w ? int32_t(l.patches + int64_t(y) * im.n_vit_w + x) : -1);
          }
    l.patches += int64_t(im.n_vit_h) * im.n_vit_w;
    l.tokens += int64_t(out_h) * out_w;
  }
  l.patch_first.push_back(l.patches);
  l.token_first.push_back(l.tokens);
  if (l.patches > INT32_MAX) fail("vision_layout", "at most 2^31 - 1 patches in a call", std::to_string(l.patches));
  return l;
}

int64_t padded_columns(int64_t cols) { return (cols + 7) / 8 * 8; }

std::vector<float> stacked_patches(const std::vector<VisionImage>& images, int64_t per_patch, int64_t cols) {
  if (cols < per_patch) fail("stacked_patches", "at least " + std::to_string(per_patch) + " columns", std::to_string(cols));
  int64_t rows = 0;
  for (const VisionImage& im : images) rows += int64_t(im.n_vit_h) * im.n_vit_w;
  std::vector<float> out(size_t(rows * cols), 0.0f);
  int64_t row = 0;
  for (const VisionImage& im : images)
    for (int64_t p = 0; p < int64_t(im.n_vit_h) * im.n_vit_w; ++p, ++row)
      for (int64_t k = 0; k < per_patch; ++k) out[size_t(row * cols + k)] = bf16_to_float(im.patches[p * per_patch + k]);
  return out;
}

std::vector<uint16_t> pad_columns(const uint16_t* bits, int64_t rows, int64_t cols, int64_t padded) {
  if (padded < cols) fail("pad_columns", "at least " + std::to_string(cols) + " columns", std::to_string(padded));
  std::vector<uint16_t> out(size_t(rows * padded), 0);  // bf16 +0
  for (int64_t i = 0; i < rows; ++i) std::copy_n(bits + i * cols, cols, out.begin() + i * padded);
  return out;
}

}  // namespace dsv41
