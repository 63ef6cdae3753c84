#pragma once
// Pillow's bicubic resize of an 8-bit image (`Image.resize(size, BICUBIC)`, libImaging/Resample.c),
// re-derived from its algorithm so that dsv41 fits images exactly as the reference's ImageOps.pad
// does (docs/vision.md §3): Keys' cubic (a = -0.5) stretched by the downscale factor, weights
// normalised in double then turned into 22-bit fixed point, the horizontal pass first into an 8-bit
// image (rounded and clamped), then the vertical pass. A pass whose size does not change is skipped.
#include "model/image/image.h"

namespace dsv41 {

// `image` resized to width × height (both >= 1); a copy when the size is the same.
RgbImage resize_bicubic(const RgbImage& image, int width, int height);

}  // namespace dsv41
