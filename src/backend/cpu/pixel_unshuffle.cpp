#include "backend/cpu/pixel_unshuffle.h"

namespace dsv41 {

void pixel_unshuffle(const float* x, int n_h, int n_w, int64_t dim, int r, float* out) {
  const int out_h = (n_h + r - 1) / r, out_w = (n_w + r - 1) / r;
  const int64_t rr = int64_t(r) * r, features = dim * rr;
  for (int I = 0; I < out_h; ++I)
    for (int J = 0; J < out_w; ++J) {
      float* token = out + (int64_t(I) * out_w + J) * features;
      for (int dy = 0; dy < r; ++dy)
        for (int dx = 0; dx < r; ++dx) {
          const int y = r * I + dy, xx = r * J + dx;
          const float* patch = y < n_h && xx < n_w ? x + (int64_t(y) * n_w + xx) * dim : nullptr;
          for (int64_t c = 0; c < dim; ++c) token[c * rr + dy * r + dx] = patch ? patch[c] : 0.0f;
        }
    }
}

}  // namespace dsv41
