#include "backend/cpu/mhc.h"

#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/norm.h"
#include "numerics/types.h"

namespace dsv41 {

namespace {

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Splits one token's mixes into pre / post / comb and makes comb doubly stochastic: a row softmax,
// then alternating column and row normalizations, ending on a column one (20 of each in V4.1).
void split_sinkhorn(const float* m, const float* scale, const float* base, int hc, int iters, float eps, float* pre,
                    float* post, float* comb) {
  for (int j = 0; j < hc; ++j) {
    pre[j] = sigmoid(m[j] * scale[0] + base[j]) + eps;
    post[j] = 2 * sigmoid(m[hc + j] * scale[1] + base[hc + j]);
  }
  for (int i = 0; i < hc; ++i) {
    float* row = comb + i * hc;
    float mx = -INFINITY;
    for (int j = 0; j < hc; ++j) {
      row[j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
      mx = std::max(mx, row[j]);
    }
    float sum = 0;
    for (int j = 0; j < hc; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
  }
  auto normalize_columns = [&] {
    for (int j = 0; j < hc; ++j) {
      float sum = 0;
      for (int i = 0; i < hc; ++i) sum += comb[i * hc + j];
      for (int i = 0; i < hc; ++i) comb[i * hc + j] /= sum + eps;
    }
  };
  auto normalize_rows = [&] {
    for (int i = 0; i < hc; ++i) {
      float sum = 0;
      for (int j = 0; j < hc; ++j) sum += comb[i * hc + j];
      for (int j = 0; j < hc; ++j) comb[i * hc + j] /= sum + eps;
    }
  };
  normalize_columns();
  for (int t = 0; t < iters - 1; ++t) {
    normalize_rows();
    normalize_columns();
  }
}

}  // namespace

void hc_mixes(const float* X, int64_t rows, int hc, int64_t d, const HcWeights& w, float norm_eps, int sinkhorn_iters,
              float hc_eps, float* pre, float* post, float* comb) {
  const int n_mix = (2 + hc) * hc;
  std::vector<float> mixes(size_t(rows * n_mix));
  // One projection of the flattened streams; the RMS is applied after it (it is one scalar per
  // token, so this equals projecting the normalized streams).
  linear_f32(X, rows, w.fn, mixes.data());
  std::vector<float> scale(3), base(static_cast<size_t>(n_mix));
  w.scale.row(0, scale.data());
  w.base.row(0, base.data());
  for (int64_t r = 0; r < rows; ++r) {
    const float inv = rms_inverse(X + r * hc * d, hc * d, norm_eps);
    float* m = mixes.data() + r * n_mix;
    for (int k = 0; k < n_mix; ++k) m[k] *= inv;
    split_sinkhorn(m, scale.data(), base.data(), hc, sinkhorn_iters, hc_eps, pre + r * hc, post + r * hc, comb + r * hc * hc);
  }
}

void hc_pre(const float* X, const float* pre, int hc, int64_t d, float* y) {
  for (int64_t k = 0; k < d; ++k) {
    float sum = 0;
    for (int i = 0; i < hc; ++i) sum += pre[i] * X[i * d + k];
    y[k] = round_bf16(sum);
  }
}

void hc_post(const float* f, const float* X, const float* post, const float* comb, int hc, int64_t d, float* out) {
  for (int j = 0; j < hc; ++j)
    for (int64_t k = 0; k < d; ++k) {
      float mix = 0;
      for (int i = 0; i < hc; ++i) mix += comb[i * hc + j] * X[i * d + k];
      out[j * d + k] = round_bf16(post[j] * f[k] + mix);
    }
}

}  // namespace dsv41
