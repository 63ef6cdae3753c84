#pragma once
// AdamW on the device: src/train/optim/adamw.h's step, bit for bit (the same fp32 operations in
// the same order, IEEE square root and division, no fused multiply-add; the bias corrections
// computed on the host as the CPU computes them). w, grad, m, v [n] are device arrays; step ≥ 1
// counts this update.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "train/optim/adamw.h"

namespace dsv41::train_cuda::optim {

void adamw_step(float* w, const float* grad, float* m, float* v, int64_t n, int64_t step, float lr,
                const dsv41::optim::AdamWOptions& options, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda::optim
