#pragma once
// The lightning indexer's scores (model.py Indexer, backend/cpu/indexer.h index_scores) and the
// loss that trains it: distillation of the main attention's scores, as DeepSeek-V3.2's DSA trains
// its indexer in the sparse stage (docs/training.md, "The indexer's gradient"; the V4.1 report
// does not say, and trains sparse from the start, with no dense warm-up).
//
// Scores of the entries a row chose (its top-k; −1 an empty slot), q [heads, d] per row, the
// per-head weights w (weights_proj x · d^-½ heads^-½, applied by the caller) and the index keys:
//
//   I_t = Σ_h relu(q_h · k_t) · w_h
//   dw_h += Σ_t dI_t relu(q_h · k_t);  where q_h · k_t > 0: dq_h += dI_t w_h k_t, dk_t += dI_t w_h q_h
//
// The loss: the target p*_t is the main attention's probability of chosen entry t summed over its
// heads and renormalized over the chosen entries (a constant: no gradient reaches the attention);
// the indexer's distribution is softmax_t(I_t) over the same entries;
//
//   L = Σ_rows KL(p* ‖ softmax(I)) = Σ_rows Σ_t p*_t (log p*_t − log softmax(I)_t)
//   dI_t = dL · (softmax(I)_t − p*_t)
//
// The top-k choice itself has no gradient: the main loss reaches the chosen entries' KV through the
// attention, and the indexer learns which to choose from L alone. Its inputs (qr, x, the
// compressor's latent) are detached, so L trains only the indexer's own weights (wq_b, weights_proj,
// wk, k_norm) and the language-model loss never flows into them.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dsv41::grad {

// q [rows, heads, d]; w [rows, heads]; keys [n, d]; idx [rows, k] rows of keys or −1;
// scores [rows, k] (an empty slot's score is −inf).
template <class T>
void indexer_scores_forward(const T* q, const T* w, const T* keys, const int64_t* idx, int64_t rows, int64_t heads, int64_t d,
                            int64_t k, T* scores) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = idx[r * k + j];
      if (t < 0) {
        scores[r * k + j] = -INFINITY;
        continue;
      }
      T sum = 0;
      for (int64_t h = 0; h < heads; ++h) {
        T dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q[(r * heads + h) * d + c] * keys[t * d + c];
        sum += std::max(dot, T(0)) * w[r * heads + h];
      }
      scores[r * k + j] = sum;
    }
}

// Adds into dq [rows, heads, d], dw [rows, heads] and dkeys [n, d].
template <class T>
void indexer_scores_backward(const T* q, const T* w, const T* keys, const int64_t* idx, int64_t rows, int64_t heads,
                             int64_t d, int64_t k, const T* dscores, T* dq, T* dw, T* dkeys) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = idx[r * k + j];
      if (t < 0) continue;
      const T g = dscores[r * k + j];
      for (int64_t h = 0; h < heads; ++h) {
        const T* qh = q + (r * heads + h) * d;
        T dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qh[c] * keys[t * d + c];
        if (dot <= T(0)) continue;
        dw[r * heads + h] += g * dot;
        const T gw = g * w[r * heads + h];
        for (int64_t c = 0; c < d; ++c) {
          dq[(r * heads + h) * d + c] += gw * keys[t * d + c];
          dkeys[t * d + c] += gw * qh[c];
        }
      }
    }
}

// The target: for each row, the attention probabilities p [rows, heads, entries]
// (sparse_attention.h's saved ones) of its compressed slots — entries first .. first + k − 1, the
// slots after the window — summed over the heads and normalized to one. target [rows, k]; an empty
// slot gets 0; a row with no mass on its chosen entries gets all zeros (it adds nothing to L).
template <class T>
void attention_target(const T* p, int64_t rows, int64_t heads, int64_t entries, int64_t first, int64_t k, T* target) {
  for (int64_t r = 0; r < rows; ++r) {
    T sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      T mass = 0;
      for (int64_t h = 0; h < heads; ++h) mass += p[(r * heads + h) * entries + first + j];
      target[r * k + j] = mass;
      sum += mass;
    }
    for (int64_t j = 0; j < k; ++j) target[r * k + j] = sum > T(0) ? target[r * k + j] / sum : T(0);
  }
}

// L = Σ_rows KL(target ‖ softmax(scores)) over the non-empty slots (scores −inf); dscores [rows, k]
// (nullptr: the loss only) gets dL = 1 times its gradient, added.
template <class T>
T index_distillation_loss(const T* scores, const T* target, int64_t rows, int64_t k, T* dscores) {
  T loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = scores + r * k;
    const T* p = target + r * k;
    T mx = -INFINITY, mass = 0;
    for (int64_t j = 0; j < k; ++j) {
      mx = std::max(mx, s[j]);
      mass += p[j];
    }
    if (mass <= T(0) || mx == -INFINITY) continue;
    T z = 0;
    for (int64_t j = 0; j < k; ++j)
      if (s[j] > -INFINITY) z += std::exp(s[j] - mx);
    const T log_z = std::log(z) + mx;
    for (int64_t j = 0; j < k; ++j) {
      if (s[j] == -INFINITY) continue;
      if (p[j] > T(0)) loss += p[j] * (std::log(p[j]) - (s[j] - log_z));
      if (dscores) dscores[r * k + j] += std::exp(s[j] - log_z) - p[j];
    }
  }
  return loss;
}

}  // namespace dsv41::grad
