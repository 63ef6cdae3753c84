#pragma once
// Sparse attention with an attention sink (kernel.py sparse_attn, backend/cpu/sparse_attention.h)
// in the reference's gathered form: every query row lists the same number of entries of one KV
// table (the sliding window's rows and, after them, the compressed entries chosen for it; −1 an
// empty slot), and each entry serves as key and value (K = V). Per row and head h, over the listed
// entries j with s_j = scale · q_h · kv_j:
//
//   p_j = exp(s_j) / (Σ_i exp(s_i) + exp(sink_h)),   o_h = Σ_j p_j kv_j
//
// The sink takes probability mass p_sink = exp(sink_h) / Z and contributes no value. The
// probabilities are exact (the CPU op's bf16 rounding of p before P·V is not kept:
// docs/training.md, "Precision flow"). With dp_j = do_h · kv_j and D = Σ_j p_j dp_j:
//
//   ds_j = p_j (dp_j − D)          dsink_h += −p_sink · D
//   dq_h += scale Σ_j ds_j kv_j     dkv_j += scale · ds_j · q_h + p_j · do_h
//
// Which entries a row lists (the window, the indexer's top-k) is decided outside, with no gradient.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dsv41::grad {

template <class T>
struct SparseAttentionSaved {
  std::vector<T> p;     // [rows, heads, entries] the entries' probabilities (0 for an empty slot)
  std::vector<T> sink;  // [rows, heads] the sink's
};

// q [rows, heads, d]; kv [n, d]; idx [rows, entries] rows of kv or −1; sink [heads]; o [rows, heads, d].
template <class T>
void sparse_attention_forward(const T* q, int64_t rows, int64_t heads, int64_t d, const T* kv, const int64_t* idx,
                              int64_t entries, const T* sink, T scale, T* o, SparseAttentionSaved<T>& saved) {
  saved.p.assign(size_t(rows * heads * entries), T(0));
  saved.sink.resize(size_t(rows * heads));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* list = idx + r * entries;
    for (int64_t h = 0; h < heads; ++h) {
      const T* qh = q + (r * heads + h) * d;
      T* p = saved.p.data() + (r * heads + h) * entries;
      // The largest exponent, the sink's included, keeps every exp at most 1.
      T mx = sink[h];
      for (int64_t j = 0; j < entries; ++j) {
        if (list[j] < 0) continue;
        T dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qh[c] * kv[list[j] * d + c];
        p[j] = dot * scale;
        mx = std::max(mx, p[j]);
      }
      T z = std::exp(sink[h] - mx);
      const T sink_e = z;
      for (int64_t j = 0; j < entries; ++j)
        if (list[j] >= 0) z += (p[j] = std::exp(p[j] - mx));
      T* oh = o + (r * heads + h) * d;
      std::fill(oh, oh + d, T(0));
      for (int64_t j = 0; j < entries; ++j) {
        if (list[j] < 0) continue;
        p[j] /= z;
        for (int64_t c = 0; c < d; ++c) oh[c] += p[j] * kv[list[j] * d + c];
      }
      saved.sink[size_t(r * heads + h)] = sink_e / z;
    }
  }
}

// Adds into dq [rows, heads, d], dkv [n, d] and dsink [heads].
template <class T>
void sparse_attention_backward(const T* q, int64_t rows, int64_t heads, int64_t d, const T* kv, const int64_t* idx,
                               int64_t entries, T scale, const SparseAttentionSaved<T>& saved, const T* dout, T* dq,
                               T* dkv, T* dsink) {
  std::vector<T> ds(static_cast<size_t>(entries));
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* list = idx + r * entries;
    for (int64_t h = 0; h < heads; ++h) {
      const T* qh = q + (r * heads + h) * d;
      const T* doh = dout + (r * heads + h) * d;
      const T* p = saved.p.data() + (r * heads + h) * entries;
      T D = 0;
      for (int64_t j = 0; j < entries; ++j) {
        ds[size_t(j)] = 0;
        if (list[j] < 0) continue;
        T dp = 0;
        for (int64_t c = 0; c < d; ++c) dp += doh[c] * kv[list[j] * d + c];
        ds[size_t(j)] = dp;
        D += p[j] * dp;
      }
      dsink[h] -= saved.sink[size_t(r * heads + h)] * D;
      T* dqh = dq + (r * heads + h) * d;
      for (int64_t j = 0; j < entries; ++j) {
        if (list[j] < 0) continue;
        const T g = p[j] * (ds[size_t(j)] - D) * scale;
        const T* k = kv + list[j] * d;
        T* dk = dkv + list[j] * d;
        for (int64_t c = 0; c < d; ++c) {
          dqh[c] += g * k[c];
          dk[c] += g * qh[c] + p[j] * doh[c];
        }
      }
    }
  }
}

}  // namespace dsv41::grad
