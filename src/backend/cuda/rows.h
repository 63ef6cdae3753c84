#pragma once
// Row plumbing of the device forward: the small element-wise and gather/scatter steps between the
// ops, over a batch of rows (tokens of several sequences one after another). Each is one kernel
// that reads and writes its rows once; none is on the roofline of a step.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda {

// X [rows, hc, d]: hc copies of the embedding row of each token (tokens [rows], device); the
// embedding is a BF16 or F32 device Weight [vocab, d].
void embed_rows(const Weight& embed, const int32_t* tokens, int64_t rows, int hc, int64_t d, float* X, cudaStream_t stream);

// X [rows, hc, d]: every stream of row rows[i] = embeddings[i] [d], for i < n (device pointers): the
// rows of image spans take their embedding instead of their token's (ForwardOptions::span_embeddings).
void embed_span_rows(const float* embeddings, const int32_t* rows, int64_t n, int hc, int64_t d, float* X, cudaStream_t stream);

// dst[i] = src[index[i]] for i < n rows of `width` floats.
void gather_rows(const float* src, const int32_t* index, int64_t n, int64_t width, float* dst, cudaStream_t stream);

// DSpark's context feature (forward.cpp record_target): out[r · stride + k] = bf16(Σ_m X[r, m, k] / hc),
// the fp32 sum over the hc streams in stream order from 0.0f, for rows × d values of X [rows, hc, d].
void stream_mean(const float* X, int64_t rows, int hc, int64_t d, float* out, int64_t stride, cudaStream_t stream);

// out = the bf16 bits of x, n values (fp32 storage of bf16 values, the activations' dtype: exact).
void to_bf16(const float* x, int64_t n, uint16_t* out, cudaStream_t stream);

// Split-K, for GEMMs whose output tiles would leave most SMs idle (decode's small weights): the
// K steps are cut into `splits` ranges of `per` steps (the last may be shorter), each range's CTAs
// write their fp32 partial sums apart, and sum_splits adds them in a fixed order. Deterministic;
// which rows share a call does not change any row's sum order (the choice depends on M only
// through the tile count, as the choice between the GEMV and the GEMM already does).
struct SplitK {
  int splits = 1, per = 0;
};
// For `tiles` output tiles over `steps` K steps: as many splits as fill the SMs once (tiles ·
// splits ≤ SMs), each at least `min_per` steps; {1, steps} when the tiles fill half the SMs.
SplitK split_k(int64_t tiles, int64_t steps, int64_t min_per);

// y[i] = Σ_s partial[s·n + i] for s = 0 .. splits − 1 in that order from 0.0f, i < n; rounded to
// bf16 if `round`.
void sum_splits(const float* partial, int splits, int64_t n, float* y, bool round, cudaStream_t stream);

// x = bf16(x · s), n values.
void scale_round(float* x, int64_t n, float s, cudaStream_t stream);

// y[r · stride + i] += x[r · n + i] for rows × n values: one fp32 add each (DSpark's Markov bias
// onto draft rows strided through a batch's logits).
void add_rows(float* y, int64_t stride, const float* x, int64_t rows, int64_t n, cudaStream_t stream);

// scores[i] = -inf where mask[i] == 0, n values.
void mask_scores(float* scores, const uint8_t* mask, int64_t n, cudaStream_t stream);

// out [rows, K] (row stride K): the k chosen positions of each row (chosen [rows, k]), those at or
// past the row's visible count (visible [rows]) as -1, then -1 up to K.
void finish_topk(const int32_t* chosen, int64_t rows, int k, const int64_t* visible, int K, int32_t* out,
                 cudaStream_t stream);

}  // namespace dsv41::cuda
