#pragma once
// An 8-bit RGB image, the form every image takes after decoding: what the reference's
// `PIL.Image.open(...).convert("RGB")` hands to its preprocessing (docs/vision.md §1).
#include <cstdint>
#include <vector>

#include "base/error.h"

namespace dsv41 {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // row-major, 3 bytes (R, G, B) per pixel

  RgbImage() = default;
  // A width × height image filled with one colour.
  RgbImage(int w, int h, uint8_t r = 0, uint8_t g = 0, uint8_t b = 0);

  uint8_t* at(int x, int y) { return pixels.data() + (int64_t(y) * width + x) * 3; }
  const uint8_t* at(int x, int y) const { return pixels.data() + (int64_t(y) * width + x) * 3; }
};

// What a request's image gets wrong (undecodable, too large, of an unsupported kind): the server
// answers it with 400 and the message, which names what was expected and what was found.
struct ImageError : Error {
  using Error::Error;
};

}  // namespace dsv41
