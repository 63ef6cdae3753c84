// RoPE: one thread per rotated pair; traffic 2·rows·heads·dim·4 bytes. The angle pos·freq and the
// rotation are the CPU's operations in the same order (no FMA contraction), with CUDA's
// full-precision cosf/sinf (not the fast intrinsics) in place of the C library's.
#include "backend/cuda/rope.h"

#include "backend/cuda/check.h"
#include "backend/cuda/pdl.cuh"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

__global__ void rope_kernel(float* x, int64_t rows, int heads, int64_t row_stride, int64_t head_stride, int half,
                            const int64_t* positions, const float* freqs, bool inverse) {
  wait_for_inputs();
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * heads * half) return;
  const int i = int(id % half);
  const int64_t h = id / half % heads, r = id / half / heads;
  float* v = x + r * row_stride + h * head_stride + 2 * i;
  const float angle = __fmul_rn(float(positions[r]), freqs[i]);
  const float c = cosf(angle), s = inverse ? -sinf(angle) : sinf(angle);
  const float a = v[0], b = v[1];
  v[0] = round_bf16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
  v[1] = round_bf16(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

}  // namespace

void rope(float* x, int64_t rows, int heads, int64_t row_stride, int64_t head_stride, int dim, const int64_t* positions,
          const float* freqs, bool inverse, cudaStream_t stream) {
  const int64_t n = rows * heads * (dim / 2);
  if (n <= 0) return;
  launch_early("cuda::rope", rope_kernel, unsigned((n + 255) / 256), 256, 0, stream, x, rows, heads, row_stride,
               head_stride, dim / 2, positions, freqs, inverse);
}

}  // namespace dsv41::cuda
