#pragma once
// Engram on the GPU, as backend/cpu/engram.h, over a batch of tokens.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::cuda {

// out [rows, cols, hd] = dsv41::engram_gather of each token's `cols` ids (ids [rows, cols]) from the
// fp8 table [table rows, hd] with its ue8m0 scales [table rows, hd / 32], read in place; bit-exact.
void engram_gather(const uint8_t* table, const uint8_t* scales, int64_t hd, const int64_t* ids, int64_t rows, int cols,
                   float* out, cudaStream_t stream = nullptr);

// dsv41::engram_gate for each token: X [rows, hc, d] (updated in place), kv [rows, hc + 1, d],
// qk [hc, d]. Device pointers. shut [rows] (device), optional: a row with shut[r] != 0 keeps its
// streams unchanged (a row of an image span: the reference's gate is shut there, docs/vision.md §9).
void engram_gate(float* X, const float* kv, const float* qk, int64_t rows, int hc, int64_t d, float eps,
                 cudaStream_t stream = nullptr, const uint8_t* shut = nullptr);

}  // namespace dsv41::cuda
