#pragma once
// The per-token tail of mHC's coefficient prediction (kernel.py hc_split_sinkhorn), shared by the
// CPU op and the CUDA kernel so that both run the same scalar steps: it is 24 numbers per token,
// computed by one thread on the GPU.
#include <math.h>

#include "numerics/types.h"

namespace dsv41 {

// Splits one token's mixes m [(2 + hc) hc] into pre [hc], post [hc] and comb [hc, hc] and makes
// comb doubly stochastic: a row softmax, then alternating column and row normalizations, ending
// on a column one (`iters` of each in total; 20 in V4.1). scale [3], base [(2 + hc) hc].
DSV41_HD inline void split_sinkhorn(const float* m, const float* scale, const float* base, int hc, int iters, float eps,
                                    float* pre, float* post, float* comb) {
  auto sigmoid = [](float x) { return 1.0f / (1.0f + expf(-x)); };
  for (int j = 0; j < hc; ++j) {
    pre[j] = sigmoid(m[j] * scale[0] + base[j]) + eps;
    post[j] = 2 * sigmoid(m[hc + j] * scale[1] + base[hc + j]);
  }
  for (int i = 0; i < hc; ++i) {
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

}  // namespace dsv41
