#pragma once
// The GEMV of cuda::linear over fp8/fp4 weights (qgemv.cu): one or two activation rows on the
// tensor cores (mma.sync over the codes as f16), the activation quantization folded in. Internal to
// the CUDA backend: linear.cu calls it where the GEMM (gemm.cuh) does not run.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"

namespace dsv41::cuda::qgemv {

// The activation rows one pass over the weight serves; more rows take several passes.
inline constexpr int64_t kMaxRows = 2;

// y[M, N] = bf16(act_quant(x) · Wᵀ) for an fp8/fp4 weight with K a multiple of 32, the CPU op's
// precision flow (cuda::linear's contract).
void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream);

}  // namespace dsv41::cuda::qgemv
