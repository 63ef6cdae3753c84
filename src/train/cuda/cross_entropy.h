#pragma once
// The next-token loss over the head's logits, the mirror of src/train/grad/cross_entropy.h after
// its product (the head is linear.h's): in fp32, with z_r the logits of row r and t_r its target,
//
//   L = (1/n) Σ_r (m_r + log s_r − z_r[t_r]),  m_r = max z_r,  s_r = Σ_v exp(z_r[v] − m_r)
//   dz_r = dL/n · (exp(z_r − m_r) / s_r − onehot(t_r))
//
// over the n rows whose target is not −1 (the others count for nothing and get a zero gradient).
// Subtracting the row's maximum keeps every exp in (0, 1]: stable at any logit scale.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// A batch of sequences, each its own loss: sequence s holds the rows begin[s] .. begin[s + 1] − 1
// (begin [sequences + 1], device, ascending from 0 to rows) and its L and n are over those rows.

// logits [rows, vocab], targets [rows] (in [0, vocab) or −1; any other value makes the loss NaN),
// device pointers. Writes row_max and row_sum [rows] (m_r, s_r: what the backward reads) and
// loss [2 · sequences]: sequence s's L (0 when none of its rows counts) at 2s and its n as a float
// at 2s + 1. Deterministic: fixed-tree sums, each sequence's the same whatever the batch around it.
void cross_entropy_forward(const float* logits, int64_t rows, int64_t vocab, const int64_t* targets, const int64_t* begin,
                           int64_t sequences, float* row_max, float* row_sum, float* loss, cudaStream_t stream = nullptr);

// dlogits [rows, vocab] = dL/dz with dL = dloss for every sequence's L; written, and may be logits
// itself (in place).
void cross_entropy_backward(const float* logits, int64_t rows, int64_t vocab, const int64_t* targets, const int64_t* begin,
                            int64_t sequences, const float* row_max, const float* row_sum, const float* loss, float dloss,
                            float* dlogits, cudaStream_t stream = nullptr);

// p [n, vocab] (written) = softmax of logits row rows[i] for each i, exp(z − m_r) / s_r from the
// forward's row_max and row_sum (the backward's probabilities): the distribution a head's logits
// give, for rows picked out of them (DSpark's loss reads the target's at its blocks' positions).
void cross_entropy_probabilities(const float* logits, int64_t vocab, const float* row_max, const float* row_sum,
                                 const int64_t* rows, int64_t n, float* p, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
