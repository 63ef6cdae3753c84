#pragma once
// DSpark's heads and its training loss (docs/training.md, "DSpark"; model.py DSparkMarkovHead,
// DSparkConfidenceHead; the DSpark paper's §3.3 as components.md §6.4 gives it).
//
// Each row i of a draft block is at position k_i (0-based) of its block; prev_i is the token before
// the draft it predicts (the anchor for k = 0) and next_i that draft's token.
//
//   Markov head:      e_i = W1[prev_i] (embedding.h's gather),  z_i = u_i + W2 e_i
//                     (u: the base logits; W1, W2 [V, r])
//   confidence head:  c_i = w · [x_i ; e_i]                             (x: the collapsed hidden; w [d + r])
//   the loss, p_i = softmax(z_i), q_i the target's distribution (a constant):
//     L = α_ce Σ_i ρ_i (−log p_i[next_i]) + α_tv Σ_i ρ_i ‖p_i − q_i‖₁ + α_conf Σ_i κ BCE(σ(c_i), c*_i),
//     c*_i = 1 − ½ ‖p_i − q_i‖₁ (the probability that speculative sampling accepts the draft), a
//     label: held constant in the backward. ρ_i: the row's position weight share, κ the rows' share.
//
// The backward of ‖·‖₁ takes sign(p − q) (0 where equal). Both the signs and c* can be held from an
// earlier forward (DSparkLabels), so that a gradient check compares the backward with the central
// difference of one smooth function, as the other tests hold the top-k and the experts.
//
// As every op of src/train/grad: templated on T, the backward ADDS into the gradients it is given.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/grad/linear.h"

namespace dsv41::grad {

// The Markov bias on the base logits, z = u + W2 e, e the rows W1[prev] (embedding.h's gather):
// u [rows, vocab], W2 [vocab, rank], e [rows, rank].
template <class T>
void markov_forward(const T* u, int64_t rows, int64_t vocab, const T* W2, int64_t rank, const T* e, T* z) {
  linear_forward(e, rows, rank, W2, vocab, z);
  for (int64_t i = 0; i < rows * vocab; ++i) z[i] += u[i];
}

// du += dz; de += dz W2; dW2 += dzᵀ e. Any of du, de, dW2 may be nullptr.
template <class T>
void markov_backward(const T* e, int64_t rows, int64_t vocab, const T* W2, int64_t rank, const T* dz, T* du, T* de, T* dW2) {
  if (du)
    for (int64_t i = 0; i < rows * vocab; ++i) du[i] += dz[i];
  linear_backward(e, rows, rank, W2, vocab, dz, de, dW2);
}

// c_i = w · [x_i ; e_i]: x [rows, d], e [rows, rank], w [d + rank].
template <class T>
void confidence_forward(const T* x, const T* e, int64_t rows, int64_t d, int64_t rank, const T* w, T* c) {
  for (int64_t i = 0; i < rows; ++i) {
    T s = 0;
    for (int64_t j = 0; j < d; ++j) s += w[j] * x[i * d + j];
    for (int64_t j = 0; j < rank; ++j) s += w[d + j] * e[i * rank + j];
    c[i] = s;
  }
}

template <class T>
void confidence_backward(const T* x, const T* e, int64_t rows, int64_t d, int64_t rank, const T* w, const T* dc, T* dx, T* de,
                         T* dw) {
  for (int64_t i = 0; i < rows; ++i) {
    const T g = dc[i];
    for (int64_t j = 0; j < d; ++j) {
      if (dx) dx[i * d + j] += g * w[j];
      if (dw) dw[j] += g * x[i * d + j];
    }
    for (int64_t j = 0; j < rank; ++j) {
      if (de) de[i * rank + j] += g * w[d + j];
      if (dw) dw[d + j] += g * e[i * rank + j];
    }
  }
}

// The loss's three coefficients (the paper's: 0.1 · L_ce + 0.9 · L_tv + 1.0 · L_conf).
struct DSparkLossWeights {
  double ce = 0.1, tv = 0.9, conf = 1.0;
};

// The labels the backward holds constant: the signs of p − q and c*, per row. Recorded by each
// forward; imposed when `held` (a gradient check's later forwards).
struct DSparkLabels {
  std::vector<signed char> signs;  // [rows, vocab]
  std::vector<double> target;      // [rows] c*
  bool held = false;
};

template <class T>
struct DSparkLossSaved {
  std::vector<T> p;  // [rows, vocab] softmax(z)
};

// The loss's parts, each already weighted by ρ or κ (unscaled by α); `accept` the κ-weighted c*.
struct DSparkLossParts {
  double ce = 0, tv = 0, conf = 0, accept = 0;
  double total(const DSparkLossWeights& a) const { return a.ce * ce + a.tv * tv + a.conf * conf; }
};

// z [rows, vocab] (Markov-corrected logits), q [rows, vocab] (the target's probabilities), next
// [rows], c [rows] (confidence logits), rho [rows], kappa (every row's share of L_conf).
template <class T>
DSparkLossParts dspark_loss_forward(const T* z, const T* q, int64_t rows, int64_t vocab, const int64_t* next, const T* c,
                                    const T* rho, T kappa, DSparkLabels& labels, DSparkLossSaved<T>& saved) {
  saved.p.resize(size_t(rows * vocab));
  if (!labels.held) {
    labels.signs.assign(size_t(rows * vocab), 0);
    labels.target.assign(size_t(rows), 0.0);
  } else if (int64_t(labels.target.size()) != rows || int64_t(labels.signs.size()) != rows * vocab) {
    fail("dspark loss", "held labels of " + std::to_string(rows) + " rows", std::to_string(labels.target.size()) + " rows");
  }
  DSparkLossParts out;
  for (int64_t i = 0; i < rows; ++i) {
    if (next[i] < 0 || next[i] >= vocab) fail("dspark loss", "next tokens in [0, " + std::to_string(vocab) + ")", std::to_string(next[i]));
    const T* zi = z + i * vocab;
    T* p = saved.p.data() + i * vocab;
    const T mx = *std::max_element(zi, zi + vocab);
    T sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(zi[v] - mx);
    for (int64_t v = 0; v < vocab; ++v) p[v] = std::exp(zi[v] - mx) / sum;
    T l1 = 0, l1_held = 0;  // ‖p − q‖₁, and Σ s (p − q) with the held signs
    for (int64_t v = 0; v < vocab; ++v) {
      const T diff = p[v] - q[i * vocab + v];
      l1 += std::fabs(diff);
      signed char& s = labels.signs[size_t(i * vocab + v)];
      if (!labels.held) s = diff > 0 ? 1 : diff < 0 ? -1 : 0;
      l1_held += T(s) * diff;
    }
    if (!labels.held) labels.target[size_t(i)] = 1.0 - 0.5 * double(l1);
    const T target = T(labels.target[size_t(i)]);
    // BCE(σ(c), t) = softplus(c) − t c, written to stay finite for any c.
    const T softplus = std::max(c[i], T(0)) + std::log1p(std::exp(-std::fabs(c[i])));
    out.ce += double(rho[i] * (mx + std::log(sum) - zi[next[i]]));
    out.tv += double(rho[i] * l1_held);
    out.conf += double(kappa * (softplus - target * c[i]));
    out.accept += double(kappa * target);
  }
  return out;
}

// dz [rows, vocab] += ∂L/∂z, dc [rows] += ∂L/∂c, L = dloss · Σ α · part.
template <class T>
void dspark_loss_backward(const T* c, int64_t rows, int64_t vocab, const int64_t* next, const T* rho, T kappa,
                          const DSparkLabels& labels, const DSparkLossSaved<T>& saved, const DSparkLossWeights& a, T dloss, T* dz,
                          T* dc) {
  std::vector<T> g(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < rows; ++i) {
    const T* p = saved.p.data() + i * vocab;
    // ∂/∂p of the TV term, then through the softmax: dz = p ⊙ (g − Σ p g).
    const T tv = dloss * T(a.tv) * rho[i];
    T pg = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      g[size_t(v)] = tv * T(labels.signs[size_t(i * vocab + v)]);
      pg += p[v] * g[size_t(v)];
    }
    const T ce = dloss * T(a.ce) * rho[i];
    T* dzi = dz + i * vocab;
    for (int64_t v = 0; v < vocab; ++v) dzi[v] += p[v] * (g[size_t(v)] - pg) + ce * p[v];
    dzi[next[i]] -= ce;
    const T sigma = T(1) / (T(1) + std::exp(-c[i]));
    dc[i] += dloss * T(a.conf) * kappa * (sigma - T(labels.target[size_t(i)]));
  }
}

}  // namespace dsv41::grad
