#pragma once
// The aligner's 3×3 pixel unshuffle (vision.py Aligner: view, zero pad, F.unfold; docs/vision.md §6).
#include <cstdint>

namespace dsv41 {

// x: the ViT's output for one image, [n_h · n_w, dim] row-major over its patch grid. out:
// [ceil(n_h/r) · ceil(n_w/r), dim · r · r], token (I, J) row-major, with
// out[I·ceil(n_w/r) + J][c·r² + dy·r + dx] = x[(r·I + dy)·n_w + r·J + dx][c], or 0 where that patch
// is past the grid (the zero padding at the bottom and right). Feature order is channel-major.
void pixel_unshuffle(const float* x, int n_h, int n_w, int64_t dim, int r, float* out);

}  // namespace dsv41
