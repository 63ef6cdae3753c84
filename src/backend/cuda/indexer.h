#pragma once
// The lightning indexer on the GPU, as backend/cpu/indexer.h, over the MXFP4 index-key cache read in
// place: scores of every compressed entry for a batch of queries, top-k, and the candidate blocks.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::cuda {

// For each query row r < rows: q [rows, heads, hd] holds bf16 values (RoPE applied); the op first
// fake-quantizes each head's q to MXFP4 per 32 (the forward's mxfp4::quantize_dequantize), then
// computes scores [rows, n] as dsv41::index_scores against the n keys of `keys`, an MXFP4 cache
// [n, mxfp4::bytes(hd)] (4-byte aligned). w [rows, heads]: the head weights, bf16 values.
// visible [rows] (optional): scores[r][t] = -inf for t >= visible[r], as the forward masks entries a
// query cannot see yet. hd is 32, 64 or 128; heads ≤ 64. All pointers are device pointers.
void index_scores(const float* q, const float* w, int64_t rows, int heads, int hd, const uint8_t* keys, int64_t n,
                  const int64_t* visible, float* scores, cudaStream_t stream = nullptr);

// positions [rows, k]: dsv41::top_positions of each row of scores [rows, n]: the min(k, n)
// highest-scoring positions in ascending order (ties to the lower position), then -1 up to k.
void top_positions(const float* scores, int64_t rows, int64_t n, int k, int32_t* positions,
                   cudaStream_t stream = nullptr);

// mask [rows, n]: dsv41::candidate_mask of each row of scores [rows, n], compress_len[r] the row's
// count of visible entries (device [rows]).
void candidate_mask(const float* scores, int64_t rows, int64_t n, const int64_t* compress_len, int topk_blocks,
                    int block_size, uint8_t* mask, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
