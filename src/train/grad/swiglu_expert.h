#pragma once
// One SwiGLU expert with the reference's clamps (model.py Expert, backend/cpu/moe.h expert_ffn):
//
//   g = W1 x, u = W3 x;  with limit L > 0: g ← min(g, L), u ← clamp(u, −L, L)
//   h = w · silu(g) · u   (w: the row's routing weight, 1 for the shared expert)
//   y = W2 h
//
// A clamped element passes no gradient; at the clamp's bound it passes (torch's clamp backward:
// min ≤ x ≤ max). With silu'(z) = σ(z)(1 + z(1 − σ(z))) and dh = W2ᵀ dy:
//
//   du = dh · w · silu(g) (where u is inside [−L, L])    dg = dh · w · u · silu'(g) (where g ≤ L)
//   dw += Σ_i dh_i · silu(g_i) · u_i
#include <algorithm>
#include <cstdint>
#include <vector>

#include "train/grad/linear.h"
#include "train/grad/scalar.h"

namespace dsv41::grad {

template <class T>
struct ExpertSaved {
  std::vector<T> gate, up;  // [rows, inter] W1 x and W3 x, before the clamps
  std::vector<T> hidden;    // [rows, inter] h
};

// x [rows, dim]; w1, w3 [inter, dim]; w2 [dim, inter]; row_weights [rows] or nullptr; y [rows, dim].
template <class T>
void expert_forward(const T* x, int64_t rows, int64_t dim, const T* w1, const T* w2, const T* w3, int64_t inter, T limit,
                    const T* row_weights, T* y, ExpertSaved<T>& saved) {
  saved.gate.resize(size_t(rows * inter));
  saved.up.resize(size_t(rows * inter));
  saved.hidden.resize(size_t(rows * inter));
  linear_forward(x, rows, dim, w1, inter, saved.gate.data());
  linear_forward(x, rows, dim, w3, inter, saved.up.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      T g = saved.gate[size_t(r * inter + i)], u = saved.up[size_t(r * inter + i)];
      if (limit > 0) {
        g = std::min(g, limit);
        u = std::clamp(u, -limit, limit);
      }
      const T w = row_weights ? row_weights[r] : T(1);
      saved.hidden[size_t(r * inter + i)] = w * (g * sigmoid(g) * u);
    }
  linear_forward(saved.hidden.data(), rows, inter, w2, dim, y);
}

// Adds into dx [rows, dim], dw1, dw2, dw3 and drow_weights [rows] (nullptr: not wanted, or no
// row weights).
template <class T>
void expert_backward(const T* x, int64_t rows, int64_t dim, const T* w1, const T* w2, const T* w3, int64_t inter, T limit,
                     const T* row_weights, const ExpertSaved<T>& saved, const T* dy, T* dx, T* dw1, T* dw2, T* dw3,
                     T* drow_weights) {
  std::vector<T> dh(size_t(rows * inter), T(0)), dg(size_t(rows * inter)), du(size_t(rows * inter));
  linear_backward(saved.hidden.data(), rows, inter, w2, dim, dy, dh.data(), dw2);
  for (int64_t r = 0; r < rows; ++r) {
    const T w = row_weights ? row_weights[r] : T(1);
    for (int64_t i = 0; i < inter; ++i) {
      const size_t e = size_t(r * inter + i);
      const T g0 = saved.gate[e], u0 = saved.up[e];
      const bool g_passes = limit <= 0 || g0 <= limit;
      const bool u_passes = limit <= 0 || (u0 >= -limit && u0 <= limit);
      const T g = g_passes ? g0 : limit, u = limit > 0 ? std::clamp(u0, -limit, limit) : u0;
      const T s = sigmoid(g), silu = g * s;
      if (drow_weights) drow_weights[r] += dh[e] * silu * u;
      du[e] = u_passes ? dh[e] * w * silu : T(0);
      dg[e] = g_passes ? dh[e] * w * u * s * (T(1) + g * (T(1) - s)) : T(0);
    }
  }
  linear_backward(x, rows, dim, w1, inter, dg.data(), dx, dw1);
  linear_backward(x, rows, dim, w3, inter, du.data(), dx, dw3);
}

}  // namespace dsv41::grad
