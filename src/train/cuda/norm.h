#pragma once
// RMSNorm of the CUDA trainer, the mirror of src/train/grad/rms_norm.h (fp32 throughout):
//
//   y = w ⊙ x · r,  r = (mean(x²) + eps)^-½ per row
//   dx += r · (w ⊙ dy) − x · r³ / dim · Σ_k (w ⊙ dy)_k x_k     dw += Σ_rows dy ⊙ x · r
//
// All pointers are device pointers; x, y, dy, dx [rows, dim] row-major, w and dw [dim], r [rows].
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// w nullptr: unweighted. Writes y (may be x) and the inverse RMS r of each row.
void rms_norm_forward(const float* x, int64_t rows, int64_t dim, const float* w, float eps, float* y, float* r,
                      cudaStream_t stream = nullptr);

// x: the forward's input. Adds into dx and (unless nullptr; it must be when w is) dw. dw's sum over
// the rows is deterministic: fixed chunks of rows, each chunk's partial written, the partials added
// in chunk order (no atomics).
void rms_norm_backward(const float* x, int64_t rows, int64_t dim, const float* w, const float* r, const float* dy,
                       float* dx, float* dw, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
