#pragma once
// The per-token tail of mHC's coefficient prediction (kernel.py hc_split_sinkhorn), shared by the
// CPU op and the CUDA kernels so that both run the same scalar steps. Its steps are per row or per
// column of the hc × hc matrix, each independent of the other rows (columns) of its step: the CPU
// runs them one after another; a GPU warp (backend/cuda/mhc.cu sinkhorn_warp) holds one element a
// lane and runs the same adds, in the same order, and divisions, with the same results.
#include <math.h>

#include "numerics/types.h"

namespace dsv41::sinkhorn {

// pre[j] and post[j] from one token's mixes m [(2 + hc) hc]; scale [3], base [(2 + hc) hc].
DSV41_HD inline void pre_post(const float* m, const float* scale, const float* base, int hc, float eps, int j, float* pre,
                              float* post) {
  auto sigmoid = [](float x) { return 1.0f / (1.0f + expf(-x)); };
  pre[j] = sigmoid(m[j] * scale[0] + base[j]) + eps;
  post[j] = 2 * sigmoid(m[hc + j] * scale[1] + base[hc + j]);
}

// Row i of comb: the softmax of its mixes, plus eps.
DSV41_HD inline void softmax_row(const float* m, const float* scale, const float* base, int hc, float eps, int i,
                                 float* comb) {
  float* row = comb + i * hc;
  float mx = -INFINITY;
  for (int j = 0; j < hc; ++j) {
    row[j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j];
    mx = row[j] > mx ? row[j] : mx;
  }
  float sum = 0;
  for (int j = 0; j < hc; ++j) sum += (row[j] = expf(row[j] - mx));
  for (int j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
}

DSV41_HD inline void normalize_column(float* comb, int hc, float eps, int j) {
  float sum = 0;
  for (int i = 0; i < hc; ++i) sum += comb[i * hc + j];
  for (int i = 0; i < hc; ++i) comb[i * hc + j] /= sum + eps;
}

DSV41_HD inline void normalize_row(float* comb, int hc, float eps, int i) {
  float sum = 0;
  for (int j = 0; j < hc; ++j) sum += comb[i * hc + j];
  for (int j = 0; j < hc; ++j) comb[i * hc + j] /= sum + eps;
}

}  // namespace dsv41::sinkhorn

namespace dsv41 {

// Splits one token's mixes m [(2 + hc) hc] into pre [hc], post [hc] and comb [hc, hc] and makes
// comb doubly stochastic: a row softmax, then alternating column and row normalizations, ending
// on a column one (`iters` of each in total; 20 in V4.1). scale [3], base [(2 + hc) hc].
DSV41_HD inline void split_sinkhorn(const float* m, const float* scale, const float* base, int hc, int iters, float eps,
                                    float* pre, float* post, float* comb) {
  for (int j = 0; j < hc; ++j) sinkhorn::pre_post(m, scale, base, hc, eps, j, pre, post);
  for (int i = 0; i < hc; ++i) sinkhorn::softmax_row(m, scale, base, hc, eps, i, comb);
  for (int j = 0; j < hc; ++j) sinkhorn::normalize_column(comb, hc, eps, j);
  for (int t = 0; t < iters - 1; ++t) {
    for (int i = 0; i < hc; ++i) sinkhorn::normalize_row(comb, hc, eps, i);
    for (int j = 0; j < hc; ++j) sinkhorn::normalize_column(comb, hc, eps, j);
  }
}

}  // namespace dsv41
