#pragma once
// RMSNorm on the GPU, as dsv41::rms_norm (backend/cpu/norm.h).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda {

// y = bf16(weight · (x · rsqrt(mean(x²) + eps))) per row of `dim`; weight a device [dim] vector
// (F32 or BF16 Weight with rows = 1) or nullptr. x, y device pointers, may be the same.
void rms_norm(const float* x, int64_t rows, int64_t dim, const Weight* weight, float eps, float* y,
              cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
