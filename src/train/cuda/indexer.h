#pragma once
// The lightning indexer's scores and its distillation loss on the CUDA trainer, the mirror of
// src/train/grad/indexer.h (fp32). Over the entries a row chose (idx [rows, k], −1 an empty slot),
// q [rows, heads, d], the per-head weights w [rows, heads] and the index keys [n, d]:
//
//   I_t = Σ_h relu(q_h · k_t) · w_h
//   dw_h += Σ_t dI_t relu(q_h · k_t);  where q_h · k_t > 0: dq_h += dI_t w_h k_t, dk_t += dI_t w_h q_h
//
// The target p*: the attention's probabilities of the chosen entries summed over the heads and
// renormalized; the loss L = Σ_rows KL(p* ‖ softmax(I)), dI = dL · (softmax(I) − p*).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// scores [rows, k] (written; −inf for an empty slot). Device pointers.
void indexer_scores_forward(const float* q, const float* w, const float* keys, const int64_t* idx, int64_t rows, int64_t heads,
                            int64_t d, int64_t k, float* scores, cudaStream_t stream = nullptr);

// Adds into dq [rows, heads, d], dw [rows, heads] and dkeys [n, d] (n: the keys' rows; listed ids
// outside [0, n) add nothing). Every sum in the CPU loop's order: dkeys by the stable sort of the
// listed ids (as the sparse attention's dkv), one block per key.
void indexer_scores_backward(const float* q, const float* w, const float* keys, int64_t n, const int64_t* idx, int64_t rows,
                             int64_t heads, int64_t d, int64_t k, const float* dscores, float* dq, float* dw, float* dkeys,
                             cudaStream_t stream = nullptr);

// target [rows, k] (written) from the attention's probabilities p [rows, heads, entries]: the
// compressed slots first .. first + k − 1 summed over the heads, normalized to one (all zeros for
// a row with no mass on them).
void attention_target(const float* p, int64_t rows, int64_t heads, int64_t entries, int64_t first, int64_t k, float* target,
                      cudaStream_t stream = nullptr);

// The distillation loss of a batch of sequences: sequence s holds the rows begin[s] .. begin[s + 1]
// − 1 of scores and target [rows, k] (begin [sequences + 1], device, ascending from 0 to rows),
// n_s of them.

// loss [sequences] (written): loss[s] = Σ over sequence s's rows of KL(target ‖ softmax(scores))
// over the non-empty slots, its rows' losses added in row order by one thread (deterministic).
void index_distillation_loss(const float* scores, const float* target, int64_t rows, int64_t k, const int64_t* begin,
                             int64_t sequences, float* loss, cudaStream_t stream = nullptr);

// dscores [rows, k] += the gradient of Σ_s (dloss / n_s) · loss[s] (each sequence's mean over its
// rows, weighted by dloss): a row of sequence s adds (dloss / n_s) · (softmax(scores) − target) at
// its non-empty slots, each a product of that factor rounded before the addition.
void index_distillation_backward(const float* scores, const float* target, int64_t rows, int64_t k, const int64_t* begin,
                                 int64_t sequences, float dloss, float* dscores, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
