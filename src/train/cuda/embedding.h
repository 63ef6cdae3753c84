#pragma once
// Row gathers of the CUDA trainer (the token embedding, Engram's n-gram rows), the mirror of
// src/train/grad/embedding.h: out[i] = table[ids[i]]; the backward adds each output row's gradient
// into the row it came from.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// table [rows, dim], ids [n], out [n, dim]: device pointers. An id outside [0, rows) gives a row of
// NaN (the loss shows it; the ids come from the data, which the host checked).
void gather_rows_forward(const float* table, int64_t rows, int64_t dim, const int64_t* ids, int64_t n, float* out,
                         cudaStream_t stream = nullptr);

// dtable[ids[i]] += dout[i] for i < n (ids outside [0, rows) are skipped). Deterministic and in
// the CPU op's order: the ids are sorted stably (CUB's radix sort), and each distinct row is added
// into by one block, its gradient rows in increasing i. Bit for bit the CPU op's sums.
void gather_rows_backward(const float* dout, int64_t dim, const int64_t* ids, int64_t n, int64_t rows, float* dtable,
                          cudaStream_t stream = nullptr);

// The same for ids that are distinct (an expert's rows; a repeated id is a race): each table row
// gets at most one gradient row, so no sort orders them — one block per id adds its row. For
// distinct ids the sorted scatter's bits: one rounding per value.
void gather_rows_backward_distinct(const float* dout, int64_t dim, const int64_t* ids, int64_t n, int64_t rows, float* dtable,
                                   cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
