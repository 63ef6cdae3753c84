#pragma once
// Manifold-constrained hyper-connections (mHC), single-pass as V4.1 uses them: the residual is
// hc parallel streams; each sub-layer reads them through `pre`, writes back through `post`, and
// mixes them through the doubly-stochastic `comb` (kernel.py hc_split_sinkhorn, model.py Block).
#include <cstdint>

#include "model/weight.h"

namespace dsv41 {

// For each of `rows` tokens, from its streams X [hc, d] (bf16 values): pre [hc], post [hc] and
// comb [hc, hc] (row-major, comb[i][j] weighs stream i into stream j), all fp32.
void hc_mixes(const float* X, int64_t rows, int hc, int64_t d, const HcWeights& w, float norm_eps, int sinkhorn_iters,
              float hc_eps, float* pre, float* post, float* comb);

// y[d] = bf16(Σ_i pre_i X_i): the sub-layer input collapsed from the streams.
void hc_pre(const float* X, const float* pre, int hc, int64_t d, float* y);

// X'_j = bf16(post_j · f + Σ_i comb[i][j] X_i): the sub-layer output written back, the residual mixed.
void hc_post(const float* f, const float* X, const float* post, const float* comb, int hc, int64_t d, float* out);

}  // namespace dsv41
