#pragma once
// The per-token tail of mHC's coefficients (kernel.py hc_split_sinkhorn, backend/cpu/sinkhorn.h)
// and its backward through the unrolled iterations. From one token's mixes m [(2 + hc) hc], with
// scale [3] and base [(2 + hc) hc]:
//
//   pre_j  = σ(m_j s0 + b_j) + eps          post_j = 2 σ(m_{hc+j} s1 + b_{hc+j})
//   comb   = rowsoftmax(m_{2hc..} s2 + b_{2hc..}) + eps, then a column normalization and
//            (iters − 1) × (row normalization, column normalization), each x / (sum + eps)
//
// comb is differentiated through every one of its 2·iters − 1 normalizations, as the forward runs
// them (not through the fixed point they approach: after 20 sweeps the rows are still ~1e-4 off
// one, and the gradient must be that of what the forward computed). A normalization of a column,
// y_i = c_i / S with S = Σ_i c_i + eps, has the backward dc_i = dy_i / S − Σ_k dy_k c_k / S²; a row
// the same along the row; the softmax dz = p ⊙ (dy − Σ p ⊙ dy). The backward recomputes the
// iterates (2·iters matrices of hc² values) from m rather than having the forward store them:
// a few thousand flops per token, against 2·iters·hc² saved values per token and sub-layer.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "train/grad/scalar.h"

namespace dsv41::grad {

namespace sinkhorn_detail {

// comb's iterates: tape[0] the softmax's output (+ eps), tape[t] the matrix after normalization t
// (odd t: columns, even t: rows), t = 1 .. 2·iters − 1. Returns the last.
template <class T>
void comb_chain(const T* m, const T* scale, const T* base, int hc, int iters, T eps, std::vector<std::vector<T>>& tape) {
  const size_t n = size_t(hc * hc);
  tape.assign(size_t(2 * iters), std::vector<T>(n));
  std::vector<T>& c = tape[0];
  for (int i = 0; i < hc; ++i) {
    T* row = c.data() + i * hc;
    T mx = -INFINITY;
    for (int j = 0; j < hc; ++j) mx = std::max(mx, row[j] = m[2 * hc + i * hc + j] * scale[2] + base[2 * hc + i * hc + j]);
    T sum = 0;
    for (int j = 0; j < hc; ++j) sum += (row[j] = std::exp(row[j] - mx));
    for (int j = 0; j < hc; ++j) row[j] = row[j] / sum + eps;
  }
  for (int t = 1; t < 2 * iters; ++t) {
    const std::vector<T>& in = tape[size_t(t - 1)];
    std::vector<T>& out = tape[size_t(t)];
    const bool columns = t % 2 == 1;
    for (int a = 0; a < hc; ++a) {
      // Line a: column a (entries (i, a)) or row a (entries (a, j)).
      auto at = [&](int b) { return columns ? b * hc + a : a * hc + b; };
      T sum = 0;
      for (int b = 0; b < hc; ++b) sum += in[size_t(at(b))];
      for (int b = 0; b < hc; ++b) out[size_t(at(b))] = in[size_t(at(b))] / (sum + eps);
    }
  }
}

}  // namespace sinkhorn_detail

// One token: m [(2 + hc) hc] → pre [hc], post [hc], comb [hc, hc] (comb[i][j] weighs stream i into j).
template <class T>
void split_sinkhorn_forward(const T* m, const T* scale, const T* base, int hc, int iters, T eps, T* pre, T* post, T* comb) {
  for (int j = 0; j < hc; ++j) {
    pre[j] = sigmoid(m[j] * scale[0] + base[j]) + eps;
    post[j] = T(2) * sigmoid(m[hc + j] * scale[1] + base[hc + j]);
  }
  std::vector<std::vector<T>> tape;
  sinkhorn_detail::comb_chain(m, scale, base, hc, iters, eps, tape);
  std::copy(tape.back().begin(), tape.back().end(), comb);
}

// Adds into dm [(2 + hc) hc], dscale [3] and dbase [(2 + hc) hc].
template <class T>
void split_sinkhorn_backward(const T* m, const T* scale, const T* base, int hc, int iters, T eps, const T* dpre,
                             const T* dpost, const T* dcomb, T* dm, T* dscale, T* dbase) {
  for (int j = 0; j < hc; ++j) {
    const T sp = sigmoid(m[j] * scale[0] + base[j]), sq = sigmoid(m[hc + j] * scale[1] + base[hc + j]);
    const T da = dpre[j] * sp * (T(1) - sp), db = dpost[j] * T(2) * sq * (T(1) - sq);
    dm[j] += da * scale[0];
    dscale[0] += da * m[j];
    dbase[j] += da;
    dm[hc + j] += db * scale[1];
    dscale[1] += db * m[hc + j];
    dbase[hc + j] += db;
  }
  std::vector<std::vector<T>> tape;
  sinkhorn_detail::comb_chain(m, scale, base, hc, iters, eps, tape);
  std::vector<T> dy(dcomb, dcomb + hc * hc), dc(size_t(hc * hc));
  for (int t = 2 * iters - 1; t >= 1; --t) {
    const std::vector<T>& in = tape[size_t(t - 1)];
    const bool columns = t % 2 == 1;
    for (int a = 0; a < hc; ++a) {
      auto at = [&](int b) { return size_t(columns ? b * hc + a : a * hc + b); };
      T sum = 0, dot = 0;
      for (int b = 0; b < hc; ++b) {
        sum += in[at(b)];
        dot += dy[at(b)] * in[at(b)];
      }
      const T S = sum + eps;
      for (int b = 0; b < hc; ++b) dc[at(b)] = dy[at(b)] / S - dot / (S * S);
    }
    dy.swap(dc);
  }
  // Through the row softmax (its + eps passes the gradient unchanged): p = tape[0] − eps.
  for (int i = 0; i < hc; ++i) {
    T dot = 0;
    for (int j = 0; j < hc; ++j) dot += (tape[0][size_t(i * hc + j)] - eps) * dy[size_t(i * hc + j)];
    for (int j = 0; j < hc; ++j) {
      const int k = 2 * hc + i * hc + j;
      const T dz = (tape[0][size_t(i * hc + j)] - eps) * (dy[size_t(i * hc + j)] - dot);
      dm[k] += dz * scale[2];
      dscale[2] += dz * m[k];
      dbase[k] += dz;
    }
  }
}

}  // namespace dsv41::grad
