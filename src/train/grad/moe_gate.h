#pragma once
// The MoE gate (model.py Gate, backend/cpu/moe.h route): scores s_e = f(logit_e / temp) of the fp32
// logits W_g x, with f = sqrt(softplus) (softplus the identity above 20, as torch's threshold) or
// the sigmoid; the top-k experts by s_e + bias_e (ties to the lower index, best first); their
// weights w_j = s_{e_j} / (Σ_l s_{e_l} + 1e-20) · route_scale (without the division when
// norm_topk_prob is off or k = 1).
//
// The choice has no gradient, and the bias steers only the choice (it is trained by the
// aux-loss-free update, not by gradients: components.md §8), so the gradient reaches the scores
// of the chosen experts alone. With S the normalizer:
//
//   ds_{e_j} = route_scale · (dw_j / S − Σ_l dw_l s_{e_l} / S²)
//   dlogit_e = ds_e · f'(logit_e / temp) / temp,  f' = σ(z) / (2 sqrt(softplus z)) or s (1 − s)
//   dx += dlogit W_g,  dW_g += dlogit xᵀ
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "model/gate.h"
#include "train/grad/linear.h"
#include "train/grad/scalar.h"

namespace dsv41::grad {

template <class T>
struct GateSaved {
  std::vector<T> logits;         // [rows, experts] W_g x
  std::vector<T> scores;         // [rows, experts] s
  std::vector<int32_t> experts;  // [rows, k] the chosen, best biased score first
};

namespace gate_detail {

// torch's softplus threshold: above it softplus is the identity.
constexpr double kSoftplusThreshold = 20;

template <class T>
T score(T z, bool sigmoid_scores) {
  if (sigmoid_scores) return sigmoid(z);
  return std::sqrt(z > T(kSoftplusThreshold) ? z : std::log1p(std::exp(z)));
}

template <class T>
T score_derivative(T z, T s, bool sigmoid_scores) {
  if (sigmoid_scores) return s * (T(1) - s);
  return (z > T(kSoftplusThreshold) ? T(1) : sigmoid(z)) / (T(2) * s);
}

inline bool sigmoid_scores(const GateOptions& opt) {
  if (opt.score_func == "sigmoid") return true;
  if (opt.score_func == "sqrtsoftplus") return false;
  fail("gate", "score_func sqrtsoftplus or sigmoid", opt.score_func);
}

inline bool normalized(const GateOptions& opt) { return opt.norm_topk_prob && opt.topk > 1; }

}  // namespace gate_detail

// x [rows, dim]; W [experts, dim]; bias [experts]. experts_out, weights [rows, topk]. With `forced`
// [rows, topk], those experts are taken instead of the best (in that order), weighted the same way
// (backend/cpu/moe.h route's `forced`: a choice held fixed).
template <class T>
void gate_forward(const T* x, int64_t rows, int64_t dim, const T* W, int64_t n_experts, const T* bias,
                  const GateOptions& opt, int32_t* experts_out, T* weights, GateSaved<T>& saved,
                  const int32_t* forced = nullptr) {
  const bool sig = gate_detail::sigmoid_scores(opt);
  const int k = opt.topk;
  if (k < 1 || k > n_experts) fail("gate", "topk in [1, " + std::to_string(n_experts) + "]", std::to_string(k));
  saved.logits.resize(size_t(rows * n_experts));
  saved.scores.resize(size_t(rows * n_experts));
  saved.experts.resize(size_t(rows * k));
  linear_forward(x, rows, dim, W, n_experts, saved.logits.data());
  std::vector<int32_t> order(static_cast<size_t>(n_experts));
  std::vector<T> biased(static_cast<size_t>(n_experts));
  for (int64_t r = 0; r < rows; ++r) {
    T* s = saved.scores.data() + r * n_experts;
    for (int64_t e = 0; e < n_experts; ++e) {
      s[e] = gate_detail::score(saved.logits[size_t(r * n_experts + e)] / T(opt.gate_temp), sig);
      biased[size_t(e)] = s[e] + bias[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return biased[size_t(a)] > biased[size_t(b)] || (biased[size_t(a)] == biased[size_t(b)] && a < b);
    });
    if (forced)
      for (int j = 0; j < k; ++j) {
        const int32_t e = forced[r * k + j];
        if (e < 0 || e >= n_experts) fail("gate", "forced experts in [0, " + std::to_string(n_experts) + ")", std::to_string(e));
        order[size_t(j)] = e;
      }
    T sum = 0;
    for (int j = 0; j < k; ++j) sum += s[order[size_t(j)]];
    for (int j = 0; j < k; ++j) {
      const int32_t e = order[size_t(j)];
      saved.experts[size_t(r * k + j)] = experts_out[r * k + j] = e;
      const T w = gate_detail::normalized(opt) ? s[e] / (sum + T(1e-20)) : s[e];
      weights[r * k + j] = w * T(opt.route_scale);
    }
  }
}

// dweights [rows, topk]; adds into dx [rows, dim] and dW [experts, dim].
template <class T>
void gate_backward(const T* x, int64_t rows, int64_t dim, const T* W, int64_t n_experts, const GateOptions& opt,
                   const GateSaved<T>& saved, const T* dweights, T* dx, T* dW) {
  const bool sig = gate_detail::sigmoid_scores(opt);
  const int k = opt.topk;
  const T rs = T(opt.route_scale), temp = T(opt.gate_temp);
  std::vector<T> dlogits(size_t(rows * n_experts), T(0));
  for (int64_t r = 0; r < rows; ++r) {
    const T* s = saved.scores.data() + r * n_experts;
    const int32_t* chosen = saved.experts.data() + r * k;
    const T* dw = dweights + r * k;
    T sum = 0, weighted = 0;  // S − 1e-20 and Σ_l dw_l s_l
    for (int j = 0; j < k; ++j) {
      sum += s[chosen[j]];
      weighted += dw[j] * s[chosen[j]];
    }
    const T S = sum + T(1e-20);
    for (int j = 0; j < k; ++j) {
      const int32_t e = chosen[j];
      const T ds = gate_detail::normalized(opt) ? rs * (dw[j] / S - weighted / (S * S)) : rs * dw[j];
      const T z = saved.logits[size_t(r * n_experts + e)] / temp;
      dlogits[size_t(r * n_experts + e)] += ds * gate_detail::score_derivative(z, s[e], sig) / temp;
    }
  }
  linear_backward(x, rows, dim, W, n_experts, dlogits.data(), dx, dW);
}

}  // namespace dsv41::grad
