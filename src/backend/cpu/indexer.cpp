#include "backend/cpu/indexer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "numerics/types.h"

namespace dsv41 {

void index_scores(const float* q, const float* w, int heads, int hd, const float* keys, int64_t n, float* scores, bool round_sum) {
#pragma omp parallel for schedule(static) if (n * heads * hd >= (int64_t(1) << 18))
  for (int64_t t = 0; t < n; ++t) {
    const float* k = keys + t * hd;
    float sum = 0;
    for (int h = 0; h < heads; ++h) {
      float dot = 0;
      for (int c = 0; c < hd; ++c) dot += q[h * hd + c] * k[c];
      sum += round_bf16(std::max(round_bf16(dot), 0.0f) * w[h]);
    }
    scores[t] = round_sum ? round_bf16(sum) : sum;
  }
}

std::vector<int64_t> top_positions(const float* scores, int64_t n, int64_t k) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  k = std::min(k, n);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  });
  order.resize(static_cast<size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<uint8_t> candidate_mask(const float* scores, int64_t n, int64_t compress_len, int topk_blocks, int block_size) {
  const int64_t blocks = (n + block_size - 1) / block_size;
  std::vector<float> block_score(size_t(blocks), -INFINITY);
  for (int64_t t = 0; t < n; ++t) block_score[t / block_size] = std::max(block_score[t / block_size], scores[t]);
  // The newest block is only partly filled; pin it so an older full block cannot outscore it.
  // (compress_len = 0: floor(-1 / block_size) = -1, no block.)
  if (compress_len > 0) {
    const int64_t last = (compress_len - 1) / block_size;
    if (last < blocks) block_score[last] = INFINITY;
  }
  std::vector<uint8_t> mask(size_t(n), 0);
  for (int64_t b : top_positions(block_score.data(), blocks, topk_blocks)) {
    if (block_score[b] == -INFINITY) continue;  // fewer reachable blocks than topk_blocks
    for (int64_t t = b * block_size; t < std::min(n, (b + 1) * block_size); ++t) mask[t] = 1;
  }
  return mask;
}

}  // namespace dsv41
