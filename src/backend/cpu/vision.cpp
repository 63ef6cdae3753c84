#include "backend/cpu/vision.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/linear.h"
#include "numerics/types.h"

namespace dsv41 {

void linear_bias(const float* x, int64_t M, const Weight& w, const Weight* bias, float* y) {
  linear_f32(x, M, w, y);
  std::vector<float> b(size_t(w.rows), 0.0f);
  if (bias) bias->row(0, b.data());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.rows; ++n) y[m * w.rows + n] = round_bf16(y[m * w.rows + n] + b[size_t(n)]);
}

void add_bf16(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i] + y[i]);
}

void silu_mul(const float* gu, int64_t M, int64_t inter, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* gate = gu + m * 2 * inter;
    const float* up = gate + inter;
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gate[i];
      const float silu = round_bf16(g / (1.0f + std::exp(-g)));
      out[m * inter + i] = round_bf16(silu * up[i]);
    }
  }
}

void gelu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(0.5f * x[i] * (1.0f + std::erf(x[i] * float(M_SQRT1_2))));
}

void vision_attention(const float* qkv, int64_t n, int heads, int head_dim, float* o) {
  const int64_t width = int64_t(heads) * head_dim, row = 3 * width;
  const float scale = 1.0f / std::sqrt(float(head_dim));
  // Queries in blocks, so that a block's scores ([block, n]) stay small for any image size.
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel
  {
    std::vector<float> q(size_t(kBlock * head_dim)), k(size_t(n * head_dim)), vt(size_t(head_dim * n));
    std::vector<float> s(size_t(kBlock * n)), acc(size_t(kBlock * head_dim));
    int cached_head = -1;
#pragma omp for schedule(static)
    for (int64_t job = 0; job < int64_t(heads) * blocks; ++job) {
      const int h = int(job / blocks);
      const int64_t i0 = (job % blocks) * kBlock, rows = std::min(kBlock, n - i0);
      if (h != cached_head) {  // this head's keys, and its values transposed ([head_dim, n])
        for (int64_t j = 0; j < n; ++j)
          for (int d = 0; d < head_dim; ++d) {
            k[size_t(j * head_dim + d)] = qkv[j * row + width + h * head_dim + d];
            vt[size_t(d * n + j)] = qkv[j * row + 2 * width + h * head_dim + d];
          }
        cached_head = h;
      }
      for (int64_t i = 0; i < rows; ++i)
        for (int d = 0; d < head_dim; ++d) q[size_t(i * head_dim + d)] = qkv[(i0 + i) * row + h * head_dim + d];
      gemm_f32(q.data(), rows, k.data(), n, head_dim, s.data(), n);
      for (int64_t i = 0; i < rows; ++i) {
        float* si = s.data() + i * n;
        float top = -INFINITY;
        for (int64_t j = 0; j < n; ++j) top = std::max(top, si[j] *= scale);
        float sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += si[j] = std::exp(si[j] - top);
        for (int64_t j = 0; j < n; ++j) si[j] /= sum;
      }
      gemm_f32(s.data(), rows, vt.data(), head_dim, n, acc.data(), head_dim);
      for (int64_t i = 0; i < rows; ++i)
        for (int d = 0; d < head_dim; ++d) o[(i0 + i) * width + h * head_dim + d] = round_bf16(acc[size_t(i * head_dim + d)]);
    }
  }
}

}  // namespace dsv41
