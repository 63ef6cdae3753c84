// RMSNorm: one block per row; the row is read twice (sum of squares, then the scaled write), the
// second time from L1/L2. Traffic: 2·rows·dim·4 bytes (read + write) + dim weights; the floor is
// that over HBM bandwidth. Statistics in fp32 as on the CPU; only the order of the sum differs.
#include "backend/cuda/norm.h"

#include "backend/cuda/check.h"
#include "backend/cuda/pdl.cuh"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;

__device__ inline float weight_at(const uint8_t* w, WeightFormat f, int64_t i) {
  if (!w) return 1.0f;
  if (f == WeightFormat::BF16) return bf16_to_float(reinterpret_cast<const uint16_t*>(w)[i]);
  return reinterpret_cast<const float*>(w)[i];
}

__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const float* x, int64_t dim, const uint8_t* w,
                                                            WeightFormat f, float eps, float* y) {
  wait_for_inputs();
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float sum = 0;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) sum = fmaf(xr[i], xr[i], sum);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  float total = 0;
  for (int k = 0; k < kThreads / 32; ++k) total += warp_sums[k];
  // 1 / sqrt, both correctly rounded (no fast math), as the CPU's 1.0f / std::sqrt.
  const float inv = 1.0f / sqrtf(total / float(dim) + eps);
  float* yr = y + int64_t(blockIdx.x) * dim;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) yr[i] = round_bf16(__fmul_rn(weight_at(w, f, i), __fmul_rn(xr[i], inv)));
}

}  // namespace

void rms_norm(const float* x, int64_t rows, int64_t dim, const Weight* weight, float eps, float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  if (weight && weight->format != WeightFormat::F32 && weight->format != WeightFormat::BF16)
    fail("cuda::rms_norm", "an F32 or BF16 norm weight", "a quantized one");
  launch_early("cuda::rms_norm", rms_norm_kernel, unsigned(rows), kThreads, 0, stream, x, dim,
               weight ? weight->data : nullptr, weight ? weight->format : WeightFormat::F32, eps, y);
}

}  // namespace dsv41::cuda
