#pragma once
// Sparse attention with an attention sink over per-row entry lists, the mirror of
// src/train/grad/sparse_attention.h (fp32; K = V; −1 an empty slot). Per row and head h, over the
// listed entries j with s_j = scale · q_h · kv_j:
//
//   p_j = exp(s_j) / (Σ_i exp(s_i) + exp(sink_h)),   o_h = Σ_j p_j kv_j
//   ds_j = p_j (dp_j − D), dp_j = do_h · kv_j, D = Σ_j p_j dp_j     dsink_h += −p_sink · D
//   dq_h += scale Σ_j ds_j kv_j     dkv_j += scale · ds_j · q_h + p_j · do_h
//
// Device pointers; q, o, dout, dq [rows, heads, d]; kv, dkv [n, d]; idx [rows, entries] (int64,
// rows of kv or −1); sink, dsink [heads]; p [rows, heads, entries] and sink_p [rows, heads] the
// saved probabilities (0 for an empty slot), as the CPU op's Saved.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// Writes o, p and sink_p.
void sparse_attention_forward(const float* q, int64_t rows, int64_t heads, int64_t d, const float* kv, const int64_t* idx,
                              int64_t entries, const float* sink, float scale, float* o, float* p, float* sink_p,
                              cudaStream_t stream = nullptr);

// Adds into dq, dkv and dsink. n: kv's rows (listed ids outside [0, n) add nothing to dkv).
// Deterministic: dsink's sum over the rows and dkv's over the rows and heads that list an entry are
// each made by one thread per output value in a fixed order (the CPU loop's), no atomics.
void sparse_attention_backward(const float* q, int64_t rows, int64_t heads, int64_t d, const float* kv, int64_t n,
                               const int64_t* idx, int64_t entries, float scale, const float* p, const float* sink_p,
                               const float* dout, float* dq, float* dkv, float* dsink, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
