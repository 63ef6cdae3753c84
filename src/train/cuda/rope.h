#pragma once
// RoPE of the CUDA trainer, the mirror of src/train/grad/rope.h (fp32, no bf16 rounding): in each
// head of head_dim values of x [rows, heads, head_dim], the last rope_dim are rotated as interleaved
// pairs (2i, 2i+1) by the angle positions[r] · freqs[i] (the fp32 product, as the CPU forms it);
// `inverse` rotates by −angle. A rotation is orthogonal: the backward is the opposite rotation of
// the output's gradient, in place (a rotated tensor feeds nothing else).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// x, positions [rows], freqs [rope_dim / 2] (backend/cpu RopeTable's): device pointers.
void rope_forward(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                  const float* freqs, bool inverse, cudaStream_t stream = nullptr);

// dx [rows, heads, head_dim] in place: the output's gradient becomes the input's.
inline void rope_backward(float* dx, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim,
                          const int64_t* positions, const float* freqs, bool inverse, cudaStream_t stream = nullptr) {
  rope_forward(dx, rows, heads, head_dim, rope_dim, positions, freqs, !inverse, stream);
}

}  // namespace dsv41::train_cuda
