#include "backend/cpu/compressor.h"

#include <algorithm>
#include <cmath>

namespace dsv41 {

void pool_group(const float* kv, const float* score, int m, int d, float* out) {
  for (int c = 0; c < d; ++c) {
    float mx = -INFINITY;
    for (int t = 0; t < m; ++t) mx = std::max(mx, score[t * d + c]);
    float sum = 0;
    for (int t = 0; t < m; ++t) sum += std::exp(score[t * d + c] - mx);
    float acc = 0;
    for (int t = 0; t < m; ++t) acc += kv[t * d + c] * (std::exp(score[t * d + c] - mx) / sum);
    out[c] = acc;
  }
}

}  // namespace dsv41
