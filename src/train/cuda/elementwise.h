#pragma once
// Elementwise sums of the CUDA trainer: a gradient passed on (straight-through, a residual, the
// Markov head's z = u + W2 e) and a constant factor (the indexer's weight scale, a loss's weight).
// One thread per value, each result one rounding: y + x, or y + s·x with s·x rounded first (no
// fma, as the CPU's -ffp-contract=off code computes it). Device pointers.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// y [n] += x [n].
void add_into(const float* x, int64_t n, float* y, cudaStream_t stream = nullptr);

// y [n] += s · x [n] (into zeros: y = s·x, bit for bit the product).
void add_scaled_into(const float* x, int64_t n, float s, float* y, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
