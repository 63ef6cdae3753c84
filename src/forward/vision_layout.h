#pragma once
// A call's images laid out for an op set that runs over all their rows at once in flat buffers (the
// CUDA one, forward/device/device_vision.cu): where each image's patch and token rows start, each
// patch's place in its grid (the 2D RoPE's angles), and the pixel unshuffle as a gather table.
// Made on the host, so that the device kernels only read tables (docs/vision.md, "On the device").
#include <cstdint>
#include <vector>

#include "forward/vision_cpu.h"

namespace dsv41 {

struct VisionLayout {
  int64_t patches = 0, tokens = 0;  // Σ N_p and Σ N_t over the call's images
  // Per image, then the end: image i's patch rows are [patch_first[i], patch_first[i + 1]), its
  // aligner token rows [token_first[i], token_first[i + 1]).
  std::vector<int64_t> patch_first, token_first;
  // [patches, 2]: each patch row's (grid row, grid column) in its own image.
  std::vector<int32_t> places;
  // [tokens, r²]: for token row t and block position q = dy·r + dx, the patch row whose features go
  // to feature c·r² + q of the token (backend/cpu/pixel_unshuffle.h), or -1 past the grid (zeros).
  std::vector<int32_t> unshuffle;
};

// The layout of `images` (each at least one patch) for downsample ratio r.
VisionLayout vision_layout(const std::vector<VisionImage>& images, int r);

// The GEMMs' K must be a multiple of 8 (16-byte rows of bf16); the patch embedding's 3·p² = 588 is
// not, so its weight and the patch rows are zero-padded to this many columns. A zero column adds
// exact zeros to every product: the values are unchanged.
int64_t padded_columns(int64_t cols);

// The call's patch rows [Σ N_p, cols] as fp32 (the bf16 values), each image's after the previous
// one, each row's 3·p² values then zeros up to cols.
std::vector<float> stacked_patches(const std::vector<VisionImage>& images, int64_t per_patch, int64_t cols);

// A [rows, cols] bf16 matrix (bits) with zero columns appended up to `padded` columns.
std::vector<uint16_t> pad_columns(const uint16_t* bits, int64_t rows, int64_t cols, int64_t padded);

}  // namespace dsv41
