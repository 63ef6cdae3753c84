#pragma once
// The lightning indexer on the GPU, as backend/cpu/indexer.h, over the MXFP4 index-key cache read in
// place: scores of every compressed entry for a batch of queries, top-k, and the candidate blocks.
//
// Each op comes twice: with one entry count n known on the host for every row (rows n apart), and
// with each row's count read from device memory (`n_device[r]`, at most `n_max`; rows n_max
// apart), so that the rows of many sequences go in one launch and a decode step can be captured
// once in a CUDA graph and replayed while the contexts grow. The grids of the second form are
// sized for n_max; blocks past a row's n do no work. Both give identical results for one n.
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
// The same with each row over its own cache: row r's keys at keys[r] (a device array of device
// pointers, 4-byte aligned), its n = min(n_device[r], n_max) read on the device; scores [rows,
// n_max], row r's n scores at r·n_max; scores[r][t] for t ≥ n are left as they were.
void index_scores(const float* q, const float* w, int64_t rows, int heads, int hd, const uint8_t* const* keys,
                  const int64_t* n_device, int64_t n_max, const int64_t* visible, float* scores,
                  cudaStream_t stream = nullptr);

// positions [rows, k]: dsv41::top_positions of each row of scores [rows, n]: the min(k, n)
// highest-scoring positions in ascending order (ties to the lower position), then -1 up to k.
// n < 2^31. Few rows of many scores (a decode step) spread each row over many blocks.
void top_positions(const float* scores, int64_t rows, int64_t n, int k, int32_t* positions,
                   cudaStream_t stream = nullptr);
// The same with row r's n = min(n_device[r], n_max) read on the device; scores [rows, n_max] (row r
// at r·n_max).
void top_positions(const float* scores, int64_t rows, const int64_t* n_device, int64_t n_max, int k,
                   int32_t* positions, cudaStream_t stream = nullptr);

// mask [rows, n]: dsv41::candidate_mask of each row of scores [rows, n], compress_len[r] the row's
// count of visible entries (device [rows]).
void candidate_mask(const float* scores, int64_t rows, int64_t n, const int64_t* compress_len, int topk_blocks,
                    int block_size, uint8_t* mask, cudaStream_t stream = nullptr);
// The same with row r's n = min(n_device[r], n_max) read on the device: scores and mask [rows,
// n_max] (row r at r·n_max); mask[r][t] for t ≥ n is left as it was.
void candidate_mask(const float* scores, int64_t rows, const int64_t* n_device, int64_t n_max,
                    const int64_t* compress_len, int topk_blocks, int block_size, uint8_t* mask,
                    cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
