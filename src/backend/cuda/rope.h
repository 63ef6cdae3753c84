#pragma once
// Rotary embedding on the GPU, as dsv41::RopeTable::apply (backend/cpu/rope.h), over many vectors.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::cuda {

// For each row r < rows and head h < heads, rotates the `dim` channels at
// x + r·row_stride + h·head_stride by position positions[r] (inverse: by -positions[r]), rounding
// to bf16. freqs: device [dim / 2], the RopeTable's frequencies. All pointers are device pointers.
void rope(float* x, int64_t rows, int heads, int64_t row_stride, int64_t head_stride, int dim, const int64_t* positions,
          const float* freqs, bool inverse, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
