#pragma once
// The Nesterov momentum step on the device (src/train/optim/nesterov.h; the element operations are
// nesterov.cuh's): momentum [n] updated in place and, when `lookahead` is not null, Ĝ [n] written
// there (it may alias grad, not momentum). Bit for bit the CPU's.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda::optim {

void nesterov_momentum(const float* grad, float* momentum, int64_t n, float mu, float* lookahead, cudaStream_t stream);

}  // namespace dsv41::train_cuda::optim
