#include "backend/cpu/engram.h"

#include <cmath>

#include "backend/cpu/norm.h"
#include "numerics/types.h"

namespace dsv41 {

void engram_gather(const uint8_t* table, const uint8_t* scales, int64_t hd, const int64_t* ids, int cols, float* out) {
  for (int c = 0; c < cols; ++c) {
    const uint8_t* row = table + ids[c] * hd;
    const uint8_t* s = scales + ids[c] * (hd / 32);
    for (int64_t i = 0; i < hd; ++i) out[c * hd + i] = round_bf16(e4m3_to_float(row[i]) * e8m0_to_float(s[i / 32]));
  }
}

void engram_gate(float* X, const float* kv, const float* qk, int hc, int64_t d, float eps) {
  const float* value = kv + hc * d;
  const float inv_sqrt_d = float(1.0 / std::sqrt(double(d)));
  for (int m = 0; m < hc; ++m) {
    float* h = X + m * d;
    const float* key = kv + m * d;
    // normalized per (token, stream) over d, not jointly over the streams
    const float rstd = rms_inverse(h, d, eps) * rms_inverse(key, d, eps);
    float dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += h[i] * qk[m * d + i] * key[i];
    dot = dot * rstd * inv_sqrt_d;
    // signed square root before the sigmoid, as the training kernel does
    const float root = std::copysign(std::sqrt(std::max(std::fabs(dot), 1e-6f)), dot);
    const float gate = 1.0f / (1.0f + std::exp(-root));
    for (int64_t i = 0; i < d; ++i) h[i] = round_bf16(h[i] + gate * value[i]);
  }
}

}  // namespace dsv41
