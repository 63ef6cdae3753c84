#include "model/image/resample.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace dsv41 {
namespace {

// Fixed-point weights: 8 bits of pixel and 2 of headroom (negative lobes, sums above 1) in 32.
constexpr int kPrecisionBits = 32 - 8 - 2;

// Keys' cubic convolution kernel with a = -0.5, written as Pillow evaluates it (support 2).
double bicubic(double x) {
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// For each output index: the first input index it reads, how many, and their fixed-point weights.
struct Taps {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out][ksize]
};

Taps taps(int in_size, int out_size) {
  Taps t;
  const double scale = double(in_size) / out_size;
  const double filterscale = std::max(scale, 1.0);  // a downscale widens the kernel (antialiasing)
  const double support = 2.0 * filterscale;
  t.ksize = int(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(out_size));
  t.count.resize(size_t(out_size));
  t.weights.assign(size_t(out_size) * size_t(t.ksize), 0);
  std::vector<double> k(size_t(t.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    // Pillow rounds the bounds by adding 0.5 and truncating toward zero.
    const int xmin = std::max(int(center - support + 0.5), 0);
    const int xmax = std::min(int(center + support + 0.5), in_size) - xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      k[size_t(x)] = bicubic((double(x + xmin) - center + 0.5) * ss);
      ww += k[size_t(x)];
    }
    int32_t* w = &t.weights[size_t(xx) * size_t(t.ksize)];
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? k[size_t(x)] / ww : k[size_t(x)];
      const double scaled = v * double(1 << kPrecisionBits);
      w[x] = v < 0 ? int32_t(-0.5 + scaled) : int32_t(0.5 + scaled);
    }
    t.first[size_t(xx)] = xmin;
    t.count[size_t(xx)] = xmax;
  }
  return t;
}

// One output pixel: the `count` input pixels from `p` on, `stride` bytes apart, times their
// fixed-point weights; the sum starts at one half and is rounded down to a level, clamped to 0..255.
void resample_pixel(const uint8_t* p, int64_t stride, const int32_t* w, int count, uint8_t* out) {
  int64_t sum[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
  for (int k = 0; k < count; ++k, p += stride)
    for (int c = 0; c < 3; ++c) sum[c] += int64_t(p[c]) * w[k];
  for (int c = 0; c < 3; ++c) out[c] = uint8_t(std::clamp<int64_t>(sum[c] >> kPrecisionBits, 0, 255));
}

// Rows [row0, row0 + out.height) of `in`, resampled along x to out.width.
void horizontal(const RgbImage& in, int row0, const Taps& t, RgbImage& out) {
  for (int y = 0; y < out.height; ++y)
    for (int xx = 0; xx < out.width; ++xx)
      resample_pixel(in.at(t.first[size_t(xx)], row0 + y), 3, &t.weights[size_t(xx) * size_t(t.ksize)],
                     t.count[size_t(xx)], out.at(xx, y));
}

// `in` resampled along y to out.height; tap positions are shifted up by `row0` (the first input
// row the horizontal pass kept).
void vertical(const RgbImage& in, int row0, const Taps& t, RgbImage& out) {
  for (int yy = 0; yy < out.height; ++yy)
    for (int x = 0; x < out.width; ++x)
      resample_pixel(in.at(x, t.first[size_t(yy)] - row0), int64_t(in.width) * 3, &t.weights[size_t(yy) * size_t(t.ksize)],
                     t.count[size_t(yy)], out.at(x, yy));
}

}  // namespace

RgbImage resize_bicubic(const RgbImage& image, int width, int height) {
  if (width < 1 || height < 1 || image.width < 1 || image.height < 1)
    throw ImageError("image resize: expected sizes of at least 1 x 1, found " + std::to_string(image.width) + " x " +
                     std::to_string(image.height) + " to " + std::to_string(width) + " x " + std::to_string(height));
  const bool need_horizontal = width != image.width;
  const bool need_vertical = height != image.height;
  if (!need_horizontal && !need_vertical) return image;

  const Taps vt = taps(image.height, height);
  // The input rows the vertical pass reads: only those go through the horizontal pass.
  const int row_first = vt.first.front();
  const int row_last = vt.first.back() + vt.count.back();
  const RgbImage* source = &image;
  int row0 = 0;
  RgbImage narrowed;
  if (need_horizontal) {
    narrowed = RgbImage(width, row_last - row_first);
    horizontal(image, row_first, taps(image.width, width), narrowed);
    source = &narrowed;
    row0 = row_first;
  }
  if (!need_vertical) return narrowed;
  RgbImage out(width, height);
  vertical(*source, row0, vt, out);
  return out;
}

}  // namespace dsv41
