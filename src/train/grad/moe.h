#pragma once
// The MoE layer (model.py MoE, forward.cpp moe()): the gate (moe_gate.h) picks each row's experts
// and weights; each routed expert (swiglu_expert.h) runs on the rows routed to it with their
// weights, its outputs added into the rows; the shared expert runs on every row.
//
//   y = Σ_j expert_{e_j}(x; w_j) + shared(x)
//
// The backward runs each expert's backward on its rows (their input, weight and parameter
// gradients), the shared expert's, and the gate's with the weights' gradients the experts gave.
#include <cstdint>
#include <vector>

#include "model/gate.h"
#include "train/grad/moe_gate.h"
#include "train/grad/swiglu_expert.h"

namespace dsv41::grad {

template <class T>
struct ExpertWeights {
  T* w1;  // [inter, dim]
  T* w2;  // [dim, inter]
  T* w3;  // [inter, dim]
};

// The layer's parameters (or their gradients: the same shapes).
template <class T>
struct MoeWeights {
  T* gate;       // [experts, dim]
  const T* gate_bias;  // [experts]: read by the forward only (no gradient: moe_gate.h)
  std::vector<ExpertWeights<T>> experts;
  ExpertWeights<T> shared;
};

template <class T>
struct MoeSaved {
  GateSaved<T> gate;
  std::vector<int32_t> experts;                // [rows, k]
  std::vector<T> weights;                      // [rows, k]
  std::vector<std::vector<int64_t>> rows_of;   // [expert] its rows, in row order
  std::vector<std::vector<int32_t>> slot_of;   // [expert] the slot j of each of its rows
  std::vector<std::vector<T>> inputs;          // [expert] its rows of x
  std::vector<ExpertSaved<T>> routed;          // [expert]
  ExpertSaved<T> shared;
};

// x, y [rows, dim]; inter: the experts' width (routed and shared alike, as V4.1). `forced`
// [rows, topk], optional: the experts each row takes (gate_forward's).
template <class T>
void moe_forward(const T* x, int64_t rows, int64_t dim, int64_t inter, const MoeWeights<T>& w, const GateOptions& opt,
                 T limit, T* y, MoeSaved<T>& saved, const int32_t* forced = nullptr) {
  const int64_t E = int64_t(w.experts.size());
  const int k = opt.topk;
  saved.experts.resize(size_t(rows * k));
  saved.weights.resize(size_t(rows * k));
  gate_forward(x, rows, dim, w.gate, E, w.gate_bias, opt, saved.experts.data(), saved.weights.data(), saved.gate, forced);
  saved.rows_of.assign(size_t(E), {});
  saved.slot_of.assign(size_t(E), {});
  saved.inputs.assign(size_t(E), {});
  saved.routed.assign(size_t(E), {});
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < k; ++j) {
      const int32_t e = saved.experts[size_t(r * k + j)];
      saved.rows_of[size_t(e)].push_back(r);
      saved.slot_of[size_t(e)].push_back(j);
    }
  expert_forward(x, rows, dim, w.shared.w1, w.shared.w2, w.shared.w3, inter, limit, static_cast<const T*>(nullptr), y,
                 saved.shared);
  std::vector<T> rw, ye;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& rs = saved.rows_of[size_t(e)];
    if (rs.empty()) continue;
    const int64_t n = int64_t(rs.size());
    std::vector<T>& xe = saved.inputs[size_t(e)];
    xe.resize(size_t(n * dim));
    rw.resize(size_t(n));
    ye.resize(size_t(n * dim));
    for (int64_t i = 0; i < n; ++i) {
      std::copy_n(x + rs[size_t(i)] * dim, dim, xe.data() + i * dim);
      rw[size_t(i)] = saved.weights[size_t(rs[size_t(i)] * k + saved.slot_of[size_t(e)][size_t(i)])];
    }
    const ExpertWeights<T>& ew = w.experts[size_t(e)];
    expert_forward(xe.data(), n, dim, ew.w1, ew.w2, ew.w3, inter, limit, rw.data(), ye.data(), saved.routed[size_t(e)]);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < dim; ++c) y[rs[size_t(i)] * dim + c] += ye[size_t(i * dim + c)];
  }
}

// Adds into dx [rows, dim] and the gradients g (gate, experts, shared; g.gate_bias is not read).
template <class T>
void moe_backward(const T* x, int64_t rows, int64_t dim, int64_t inter, const MoeWeights<T>& w, const GateOptions& opt,
                  T limit, const MoeSaved<T>& saved, const T* dy, T* dx, const MoeWeights<T>& g) {
  const int64_t E = int64_t(w.experts.size());
  const int k = opt.topk;
  expert_backward(x, rows, dim, w.shared.w1, w.shared.w2, w.shared.w3, inter, limit, static_cast<const T*>(nullptr),
                  saved.shared, dy, dx, g.shared.w1, g.shared.w2, g.shared.w3, static_cast<T*>(nullptr));
  std::vector<T> dweights(size_t(rows * k), T(0)), rw, dye, dxe, drw;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& rs = saved.rows_of[size_t(e)];
    if (rs.empty()) continue;
    const int64_t n = int64_t(rs.size());
    rw.resize(size_t(n));
    dye.resize(size_t(n * dim));
    dxe.assign(size_t(n * dim), T(0));
    drw.assign(size_t(n), T(0));
    for (int64_t i = 0; i < n; ++i) {
      rw[size_t(i)] = saved.weights[size_t(rs[size_t(i)] * k + saved.slot_of[size_t(e)][size_t(i)])];
      std::copy_n(dy + rs[size_t(i)] * dim, dim, dye.data() + i * dim);
    }
    const ExpertWeights<T>& ew = w.experts[size_t(e)];
    const ExpertWeights<T>& ge = g.experts[size_t(e)];
    expert_backward(saved.inputs[size_t(e)].data(), n, dim, ew.w1, ew.w2, ew.w3, inter, limit, rw.data(),
                    saved.routed[size_t(e)], dye.data(), dxe.data(), ge.w1, ge.w2, ge.w3, drw.data());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = 0; c < dim; ++c) dx[rs[size_t(i)] * dim + c] += dxe[size_t(i * dim + c)];
      dweights[size_t(rs[size_t(i)] * k + saved.slot_of[size_t(e)][size_t(i)])] += drw[size_t(i)];
    }
  }
  gate_backward(x, rows, dim, w.gate, E, opt, saved.gate, dweights.data(), dx, g.gate);
}

}  // namespace dsv41::grad
