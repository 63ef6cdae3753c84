#pragma once
// Nesterov momentum on the device, element by element as src/train/optim/nesterov.h computes it
// (the same fp32 operations in the same order; the kernels build with --fmad=false, so no product
// is fused into an add): m ← μ m + (1 − μ) g, Ĝ = μ m + (1 − μ) g.
#include <cuda_runtime.h>

namespace dsv41::train_cuda::optim {

// The momentum's new value from its old one.
__device__ inline float nesterov_momentum(float m, float g, float mu) { return mu * m + (1 - mu) * g; }
// The look-ahead Ĝ from the momentum's new value: recomputed where it is read rather than stored
// (the Sinkhorn update's passes), it is the same bits as the CPU's stored Ĝ.
__device__ inline float nesterov_lookahead(float m_new, float g, float mu) { return mu * m_new + (1 - mu) * g; }

}  // namespace dsv41::train_cuda::optim
