#pragma once
// The lightning indexer of CSA2 (model.py Indexer, select_candidate_blocks): scores of compressed
// entries for one query, the two-level selection over candidate blocks, and top-k.
#include <cstdint>
#include <vector>

namespace dsv41 {

// I_t = bf16(Σ_h bf16(relu(bf16(q_h · k_t)) · w_h)) for t < n: q [heads, hd], keys [n, hd] and
// w [heads] hold bf16 values; each rounding is one the reference makes on its bf16 tensors.
// round_sum = false leaves the fp32 sum over these heads unrounded: a rank's part of the score
// (model/partition.h), the ranks' parts added and then rounded.
void index_scores(const float* q, const float* w, int heads, int hd, const float* keys, int64_t n, float* scores,
                  bool round_sum = true);

// The k highest-scoring positions of scores[0, n), returned in ascending position order. Equal
// scores (the reference leaves their order to torch.topk) go to the lower position.
std::vector<int64_t> top_positions(const float* scores, int64_t n, int64_t k);

// Level one of the hierarchical indexer for one query: blocks of `block_size` positions scored by
// their best position, the block holding the query's newest visible entry (compress_len - 1)
// forced in, the best `topk_blocks` blocks with a finite score kept. Returns a mask over [0, n).
std::vector<uint8_t> candidate_mask(const float* scores, int64_t n, int64_t compress_len, int topk_blocks, int block_size);

}  // namespace dsv41
