#pragma once
// Image bytes to RGB8, as the reference sees them: PIL.Image.open(...).convert("RGB")
// (docs/vision.md §1 lists Pillow's conversions, and "Image decoding" how dsv41 does each).
// PNG through libpng, JPEG through libjpeg-turbo; every other format is refused by name.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/image/image.h"

namespace dsv41 {

struct DecodeLimits {
  // Pillow's MAX_IMAGE_PIXELS: what dsv41 refuses is what Pillow warns about as a decompression
  // bomb. Checked against the header, before any pixel is decoded.
  int64_t max_pixels = 89'478'485;
};

// The decoded image, or ImageError naming what is wrong: no data, a format other than PNG and
// JPEG (named when recognised), a truncated or corrupt file, an image over the limits, a kind of
// JPEG not supported (CMYK, YCCK).
RgbImage decode_image(const uint8_t* data, size_t size, const DecodeLimits& limits = {});

// The format the bytes' signature announces ("PNG", "JPEG", "GIF", "WebP", "SVG", ...), or "" when
// none is recognised.
std::string image_format(const uint8_t* data, size_t size);

}  // namespace dsv41
