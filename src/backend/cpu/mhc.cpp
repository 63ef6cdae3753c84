#include "backend/cpu/mhc.h"

#include <cmath>
#include <vector>

#include "backend/cpu/linear.h"
#include "backend/cpu/norm.h"
#include "backend/cpu/sinkhorn.h"
#include "numerics/types.h"

namespace dsv41 {

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
