#pragma once
// Manifold-constrained hyper-connections (model.py Block.hc_mixes / hc_pre / hc_post, and the
// embedding's expansion into the streams; backend/cpu/mhc.h), single-pass as V4.1 uses them. The
// residual is hc streams X [rows, hc, d]; without the reference's bf16 rounding of the sub-layer
// input and of the new streams (docs/training.md, "Precision flow").
//
//   hc_mixes:  m = (fn · vec X) · r, r = (mean(vec X²) + eps)^-½, then split_sinkhorn (sinkhorn.h)
//              dm → draw = dm r, dr = Σ dm ⊙ (fn · vec X);
//              d vec X += fnᵀ draw − dr r³ vec X / (hc d);  dfn += draw (vec X)ᵀ
//   hc_pre:    y = Σ_i pre_i X_i          dX_i += pre_i dy;  dpre_i += dy · X_i
//   hc_post:   X'_j = post_j f + Σ_i comb_ij X_i
//              df += Σ_j post_j dX'_j;  dpost_j += dX'_j · f;  dcomb_ij += dX'_j · X_i;
//              dX_i += Σ_j comb_ij dX'_j
//   hc_expand: X_i = x for every stream (the embedding's copies); dx += Σ_i dX_i
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "train/grad/linear.h"
#include "train/grad/sinkhorn.h"

namespace dsv41::grad {

struct HcOptions {
  int hc = 4;
  int sinkhorn_iters = 20;
  double norm_eps = 1e-20;
  double hc_eps = 1e-6;
};

template <class T>
struct HcMixesSaved {
  std::vector<T> raw;  // [rows, (2 + hc) hc] fn · vec X
  std::vector<T> r;    // [rows] the streams' inverse RMS
};

// X [rows, hc, d]; fn [(2 + hc) hc, hc d], base [(2 + hc) hc], scale [3]; pre, post [rows, hc],
// comb [rows, hc, hc].
template <class T>
void hc_mixes_forward(const T* X, int64_t rows, int64_t d, const T* fn, const T* base, const T* scale, const HcOptions& o,
                      T* pre, T* post, T* comb, HcMixesSaved<T>& saved) {
  const int hc = o.hc, n_mix = (2 + hc) * hc;
  const int64_t K = hc * d;
  saved.raw.resize(size_t(rows * n_mix));
  saved.r.resize(size_t(rows));
  linear_forward(X, rows, K, fn, n_mix, saved.raw.data());
  std::vector<T> m(static_cast<size_t>(n_mix));
  for (int64_t r = 0; r < rows; ++r) {
    T ss = 0;
    for (int64_t k = 0; k < K; ++k) ss += X[r * K + k] * X[r * K + k];
    const T inv = T(1) / std::sqrt(ss / T(K) + T(o.norm_eps));
    saved.r[size_t(r)] = inv;
    for (int k = 0; k < n_mix; ++k) m[size_t(k)] = saved.raw[size_t(r * n_mix + k)] * inv;
    split_sinkhorn_forward(m.data(), scale, base, hc, o.sinkhorn_iters, T(o.hc_eps), pre + r * hc, post + r * hc,
                           comb + r * hc * hc);
  }
}

// Adds into dX [rows, hc, d], dfn, dbase and dscale.
template <class T>
void hc_mixes_backward(const T* X, int64_t rows, int64_t d, const T* fn, const T* base, const T* scale, const HcOptions& o,
                       const HcMixesSaved<T>& saved, const T* dpre, const T* dpost, const T* dcomb, T* dX, T* dfn, T* dbase,
                       T* dscale) {
  const int hc = o.hc, n_mix = (2 + hc) * hc;
  const int64_t K = hc * d;
  std::vector<T> m(static_cast<size_t>(n_mix)), dm(static_cast<size_t>(n_mix)), draw(size_t(rows * n_mix));
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = saved.r[size_t(r)];
    const T* raw = saved.raw.data() + r * n_mix;
    for (int k = 0; k < n_mix; ++k) m[size_t(k)] = raw[k] * inv;
    std::fill(dm.begin(), dm.end(), T(0));
    split_sinkhorn_backward(m.data(), scale, base, hc, o.sinkhorn_iters, T(o.hc_eps), dpre + r * hc, dpost + r * hc,
                            dcomb + r * hc * hc, dm.data(), dscale, dbase);
    T dr = 0;
    for (int k = 0; k < n_mix; ++k) {
      draw[size_t(r * n_mix + k)] = dm[size_t(k)] * inv;
      dr += dm[size_t(k)] * raw[k];
    }
    const T c = dr * inv * inv * inv / T(K);
    for (int64_t k = 0; k < K; ++k) dX[r * K + k] -= c * X[r * K + k];
  }
  linear_backward(X, rows, K, fn, n_mix, draw.data(), dX, dfn);
}

// y [rows, d] = Σ_i pre_i X_i.
template <class T>
void hc_pre_forward(const T* X, const T* pre, int64_t rows, int hc, int64_t d, T* y) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < d; ++k) {
      T sum = 0;
      for (int i = 0; i < hc; ++i) sum += pre[r * hc + i] * X[(r * hc + i) * d + k];
      y[r * d + k] = sum;
    }
}

template <class T>
void hc_pre_backward(const T* X, const T* pre, int64_t rows, int hc, int64_t d, const T* dy, T* dX, T* dpre) {
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < hc; ++i) {
      T dot = 0;
      for (int64_t k = 0; k < d; ++k) {
        dX[(r * hc + i) * d + k] += pre[r * hc + i] * dy[r * d + k];
        dot += dy[r * d + k] * X[(r * hc + i) * d + k];
      }
      dpre[r * hc + i] += dot;
    }
}

// out [rows, hc, d]: out_j = post_j f + Σ_i comb_ij X_i; f [rows, d]. out must not be X.
template <class T>
void hc_post_forward(const T* f, const T* X, const T* post, const T* comb, int64_t rows, int hc, int64_t d, T* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < hc; ++j)
      for (int64_t k = 0; k < d; ++k) {
        T mix = 0;
        for (int i = 0; i < hc; ++i) mix += comb[(r * hc + i) * hc + j] * X[(r * hc + i) * d + k];
        out[(r * hc + j) * d + k] = post[r * hc + j] * f[r * d + k] + mix;
      }
}

template <class T>
void hc_post_backward(const T* f, const T* X, const T* post, const T* comb, int64_t rows, int hc, int64_t d, const T* dout,
                      T* df, T* dX, T* dpost, T* dcomb) {
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < hc; ++j) {
      const T* g = dout + (r * hc + j) * d;
      T dot = 0;
      for (int64_t k = 0; k < d; ++k) {
        df[r * d + k] += post[r * hc + j] * g[k];
        dot += g[k] * f[r * d + k];
      }
      dpost[r * hc + j] += dot;
      for (int i = 0; i < hc; ++i) {
        const T* xi = X + (r * hc + i) * d;
        const T w = comb[(r * hc + i) * hc + j];
        T dc = 0;
        for (int64_t k = 0; k < d; ++k) {
          dc += g[k] * xi[k];
          dX[(r * hc + i) * d + k] += w * g[k];
        }
        dcomb[(r * hc + i) * hc + j] += dc;
      }
    }
}

// X [rows, hc, d]: hc copies of x [rows, d].
template <class T>
void hc_expand_forward(const T* x, int64_t rows, int hc, int64_t d, T* X) {
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < hc; ++i) std::copy_n(x + r * d, d, X + (r * hc + i) * d);
}

template <class T>
void hc_expand_backward(const T* dX, int64_t rows, int hc, int64_t d, T* dx) {
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < hc; ++i)
      for (int64_t k = 0; k < d; ++k) dx[r * d + k] += dX[(r * hc + i) * d + k];
}

}  // namespace dsv41::grad
