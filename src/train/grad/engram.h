#pragma once
// Engram's gate (model.py Engram.forward, backend/cpu/engram.h engram_gate). The lookup before it
// is a row gather (embedding.h: the token's n-gram rows of the table, [cols · head_dim] per token)
// and one linear (linear.h: wkv, to [(hc + 1) d]: a key per stream, then the shared value). Per
// token and stream m, with key_m and value from kv and w_m = q_weight_m ⊙ k_weight_m:
//
//   A = Σ_i h_i w_i key_i,  rh = (mean h² + eps)^-½,  rk = (mean key² + eps)^-½
//   dot = A · rh · rk / √d;  root = sign(dot) · sqrt(max(|dot|, 1e-6));  g = σ(root)
//   h' = h + g · value
//
// Below the clamp (|dot| < 1e-6) the root is constant and passes no gradient; above it
// droot/ddot = 1 / (2 sqrt|dot|). The reference's bf16 rounding of h' is not kept.
//
//   dvalue += g dh';  dg = dh' · value;  ddot = dg · g (1 − g) · droot/ddot
//   dA = ddot rh rk / √d;  drh = ddot A rk / √d;  drk = ddot A rh / √d
//   dh += dh' + dA w ⊙ key − drh rh³ h / d;  dkey += dA w ⊙ h − drk rk³ key / d
//   dq_weight += dA h ⊙ key ⊙ k_weight;  dk_weight += dA h ⊙ key ⊙ q_weight
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "train/grad/scalar.h"

namespace dsv41::grad {

// The floor under |dot| before the square root (model.py Engram.clamp_value).
inline constexpr double kEngramClamp = 1e-6;

template <class T>
struct EngramGateSaved {
  std::vector<T> A, rh, rk, dot, gate;  // [rows, hc] each
};

// X, out [rows, hc, d] (out must not be X); kv [rows, (hc + 1) d]; q_weight, k_weight [hc, d].
template <class T>
void engram_gate_forward(const T* X, const T* kv, const T* q_weight, const T* k_weight, int64_t rows, int hc, int64_t d,
                         T eps, T* out, EngramGateSaved<T>& saved) {
  for (std::vector<T>* v : {&saved.A, &saved.rh, &saved.rk, &saved.dot, &saved.gate}) v->resize(size_t(rows * hc));
  const T inv_sqrt_d = T(1) / std::sqrt(T(d));
  for (int64_t r = 0; r < rows; ++r) {
    const T* value = kv + (r * (hc + 1) + hc) * d;
    for (int m = 0; m < hc; ++m) {
      const size_t s = size_t(r * hc + m);
      const T* h = X + (r * hc + m) * d;
      const T* key = kv + (r * (hc + 1) + m) * d;
      T A = 0, hh = 0, kk = 0;
      for (int64_t i = 0; i < d; ++i) {
        A += h[i] * q_weight[m * d + i] * k_weight[m * d + i] * key[i];
        hh += h[i] * h[i];
        kk += key[i] * key[i];
      }
      saved.A[s] = A;
      saved.rh[s] = T(1) / std::sqrt(hh / T(d) + eps);
      saved.rk[s] = T(1) / std::sqrt(kk / T(d) + eps);
      const T dot = saved.dot[s] = A * saved.rh[s] * saved.rk[s] * inv_sqrt_d;
      const T g = saved.gate[s] = sigmoid(std::copysign(std::sqrt(std::max(std::fabs(dot), T(kEngramClamp))), dot));
      T* o = out + (r * hc + m) * d;
      for (int64_t i = 0; i < d; ++i) o[i] = h[i] + g * value[i];
    }
  }
}

// Adds into dX [rows, hc, d], dkv [rows, (hc + 1) d], dq_weight and dk_weight [hc, d].
template <class T>
void engram_gate_backward(const T* X, const T* kv, const T* q_weight, const T* k_weight, int64_t rows, int hc, int64_t d,
                          const EngramGateSaved<T>& saved, const T* dout, T* dX, T* dkv, T* dq_weight, T* dk_weight) {
  const T inv_sqrt_d = T(1) / std::sqrt(T(d));
  for (int64_t r = 0; r < rows; ++r) {
    const T* value = kv + (r * (hc + 1) + hc) * d;
    T* dvalue = dkv + (r * (hc + 1) + hc) * d;
    for (int m = 0; m < hc; ++m) {
      const size_t s = size_t(r * hc + m);
      const T* h = X + (r * hc + m) * d;
      const T* key = kv + (r * (hc + 1) + m) * d;
      const T* g_out = dout + (r * hc + m) * d;
      T* dh = dX + (r * hc + m) * d;
      T* dkey = dkv + (r * (hc + 1) + m) * d;
      const T g = saved.gate[s], dot = saved.dot[s], A = saved.A[s], rh = saved.rh[s], rk = saved.rk[s];
      T dg = 0;
      for (int64_t i = 0; i < d; ++i) {
        dvalue[i] += g * g_out[i];
        dg += g_out[i] * value[i];
        dh[i] += g_out[i];
      }
      const T droot = std::fabs(dot) > T(kEngramClamp) ? T(1) / (T(2) * std::sqrt(std::fabs(dot))) : T(0);
      const T ddot = dg * g * (T(1) - g) * droot;
      const T dA = ddot * rh * rk * inv_sqrt_d, drh = ddot * A * rk * inv_sqrt_d, drk = ddot * A * rh * inv_sqrt_d;
      const T ch = drh * rh * rh * rh / T(d), ck = drk * rk * rk * rk / T(d);
      for (int64_t i = 0; i < d; ++i) {
        const T q = q_weight[m * d + i], k = k_weight[m * d + i];
        dh[i] += dA * q * k * key[i] - ch * h[i];
        dkey[i] += dA * q * k * h[i] - ck * key[i];
        dq_weight[m * d + i] += dA * h[i] * key[i] * k;
        dk_weight[m * d + i] += dA * h[i] * key[i] * q;
      }
    }
  }
}

}  // namespace dsv41::grad
