#include "backend/cpu/vision_rope.h"

#include <cmath>
#include <string>

#include "base/error.h"
#include "numerics/types.h"

namespace dsv41 {

VisionRope::VisionRope(int head_dim, double theta) : head_dim_(head_dim) {
  if (head_dim <= 0 || head_dim % 4 != 0)
    fail("vision RoPE", "a head dimension that is a positive multiple of 4", std::to_string(head_dim));
  // inv_freq = 1 / theta^(arange(0, rope_dim, 2) / rope_dim) with rope_dim = head_dim / 2, each
  // step in fp32 as torch evaluates it.
  const int rope_dim = head_dim / 2;
  freqs_.resize(size_t(rope_dim / 2));
  for (int i = 0; i < rope_dim / 2; ++i) {
    const float e = float(2 * i) / float(rope_dim);
    freqs_[size_t(i)] = 1.0f / std::pow(float(theta), e);
  }
}

void VisionRope::apply(float* x, int heads, int row, int col) const {
  const int half = head_dim_ / 2, n = half / 2;
  for (int j = 0; j < half; ++j) {
    // fp32 products of the position and the frequency, as `positions.float() * inv_freq`.
    const float angle = j < n ? float(row) * freqs_[size_t(j)] : float(col) * freqs_[size_t(j - n)];
    const float c = std::cos(angle), s = std::sin(angle);
    for (int h = 0; h < heads; ++h) {
      float* v = x + int64_t(h) * head_dim_;
      const float x1 = v[j], x2 = v[j + half];
      v[j] = round_bf16(x1 * c - x2 * s);
      v[j + half] = round_bf16(x2 * c + x1 * s);
    }
  }
}

}  // namespace dsv41
