#include "backend/cpu/rope.h"

#include <algorithm>
#include <cmath>

#include "numerics/types.h"

namespace dsv41 {

RopeTable::RopeTable(int dim, double base, int64_t original_seq_len, double factor, int beta_fast, int beta_slow)
    : dim_(dim), freqs_(size_t(dim / 2)) {
  // freqs_i = 1 / base^(2i/d), each step in fp32 as torch evaluates `1.0 / (base ** (arange / dim))`.
  for (int i = 0; i < dim / 2; ++i) {
    float e = float(2 * i) / float(dim);
    freqs_[i] = 1.0f / std::pow(float(base), e);
  }
  if (original_seq_len > 0) {
    // YaRN: dimensions whose wavelength fits the training context keep their frequency, those far
    // beyond it are divided by `factor`, and a linear ramp blends the band between.
    auto corrected_dim = [&](double rotations) {
      return dim * std::log(double(original_seq_len) / (rotations * 2 * M_PI)) / (2 * std::log(base));
    };
    const double low = std::max(std::floor(corrected_dim(beta_fast)), 0.0);
    const double high = std::min(std::ceil(corrected_dim(beta_slow)), double(dim - 1));
    const float span = float(std::max(high - low, 1e-3));
    for (int i = 0; i < dim / 2; ++i) {
      float ramp = std::clamp((float(i) - float(low)) / span, 0.0f, 1.0f);
      float smooth = 1.0f - ramp;
      freqs_[i] = freqs_[i] / float(factor) * (1.0f - smooth) + freqs_[i] * smooth;
    }
  }
}

void RopeTable::apply(float* x, int64_t pos, bool inverse) const {
  for (int i = 0; i < dim_ / 2; ++i) {
    const float angle = float(pos) * freqs_[i];
    const float c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = round_bf16(a * c - b * s);
    x[2 * i + 1] = round_bf16(a * s + b * c);
  }
}

}  // namespace dsv41
