#include "backend/cpu/sparse_attention.h"

#include <algorithm>
#include <cmath>

#include "numerics/types.h"

namespace dsv41 {

namespace {
constexpr size_t kBlock = 64;  // the kernel's index block
}

void sparse_attention(const float* q, int heads, int d, const std::vector<const float*>& entries, const float* sink,
                      float scale, float* out) {
  std::vector<float> acc(static_cast<size_t>(d)), block_acc(static_cast<size_t>(d)), s(kBlock), p(kBlock);
  for (int h = 0; h < heads; ++h) {
    const float* qh = q + size_t(h) * d;
    std::fill(acc.begin(), acc.end(), 0.0f);
    float sum_exp = 0, running_max = -1e30f;  // finite, so an all-empty row gives zeros, not NaN
    for (size_t b0 = 0; b0 < entries.size(); b0 += kBlock) {
      const size_t n = std::min(kBlock, entries.size() - b0);
      float block_max = -INFINITY;
      for (size_t j = 0; j < n; ++j) {
        const float* k = entries[b0 + j];
        if (!k) {
          s[j] = -INFINITY;
          continue;
        }
        float dot = 0;
        for (int c = 0; c < d; ++c) dot += qh[c] * k[c];
        s[j] = dot * scale;
        block_max = std::max(block_max, s[j]);
      }
      const float previous = running_max;
      running_max = std::max(previous, block_max);
      const float rescale = std::exp(previous - running_max);
      float block_sum = 0;
      for (size_t j = 0; j < n; ++j) block_sum += (p[j] = std::exp(s[j] - running_max));
      sum_exp = sum_exp * rescale + block_sum;
      std::fill(block_acc.begin(), block_acc.end(), 0.0f);
      for (size_t j = 0; j < n; ++j) {
        if (!entries[b0 + j]) continue;
        const float pj = round_bf16(p[j]);  // the kernel casts probabilities to bf16 before P·V
        const float* v = entries[b0 + j];
        for (int c = 0; c < d; ++c) block_acc[c] += pj * v[c];
      }
      for (int c = 0; c < d; ++c) acc[c] = acc[c] * rescale + block_acc[c];
    }
    sum_exp += std::exp(sink[h] - running_max);
    for (int c = 0; c < d; ++c) out[size_t(h) * d + c] = round_bf16(acc[c] / sum_exp);
  }
}

}  // namespace dsv41
