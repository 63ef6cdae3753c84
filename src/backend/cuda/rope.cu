// RoPE: one thread per rotated pair of G heads (the largest of 8, 4, 2, 1 dividing the heads): the
// angle's cosine and sine, CUDA's full-precision cosf/sinf, once for the G heads (it was once per
// head: 64 times for a query row), the G pairs' loads out together. The angle pos·freq
// and the rotation are the CPU's operations in the same order (no FMA contraction), with cosf/sinf
// in place of the C library's. Traffic 2·rows·heads·dim·4 bytes.
#include "backend/cuda/rope.h"

#include "backend/cuda/check.h"
#include "backend/cuda/pdl.cuh"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

template <int G>
__global__ void rope_kernel(float* x, int64_t rows, int heads, int64_t row_stride, int64_t head_stride, int half,
                            const int64_t* positions, const float* freqs, bool inverse) {
  wait_for_inputs();
  const int groups = heads / G;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * groups * half) return;
  const int i = int(id % half);
  const int64_t g = id / half % groups, r = id / half / groups;
  float* v = x + r * row_stride + g * G * head_stride + 2 * i;
  float a[G], b[G];
#pragma unroll
  for (int h = 0; h < G; ++h) a[h] = v[h * head_stride], b[h] = v[h * head_stride + 1];
  const float angle = __fmul_rn(float(positions[r]), freqs[i]);
  const float c = cosf(angle), s = inverse ? -sinf(angle) : sinf(angle);
#pragma unroll
  for (int h = 0; h < G; ++h) {
    v[h * head_stride] = round_bf16(__fsub_rn(__fmul_rn(a[h], c), __fmul_rn(b[h], s)));
    v[h * head_stride + 1] = round_bf16(__fadd_rn(__fmul_rn(a[h], s), __fmul_rn(b[h], c)));
  }
}

template <int G>
void launch(float* x, int64_t rows, int heads, int64_t row_stride, int64_t head_stride, int dim,
            const int64_t* positions, const float* freqs, bool inverse, cudaStream_t stream) {
  const int64_t n = rows * (heads / G) * (dim / 2);
  launch_early("cuda::rope", rope_kernel<G>, unsigned((n + 255) / 256), 256, 0, stream, x, rows, heads, row_stride,
               head_stride, dim / 2, positions, freqs, inverse);
}

}  // namespace

void rope(float* x, int64_t rows, int heads, int64_t row_stride, int64_t head_stride, int dim, const int64_t* positions,
          const float* freqs, bool inverse, cudaStream_t stream) {
  if (rows * heads * (dim / 2) <= 0) return;
  if (heads % 8 == 0) launch<8>(x, rows, heads, row_stride, head_stride, dim, positions, freqs, inverse, stream);
  else if (heads % 4 == 0) launch<4>(x, rows, heads, row_stride, head_stride, dim, positions, freqs, inverse, stream);
  else if (heads % 2 == 0) launch<2>(x, rows, heads, row_stride, head_stride, dim, positions, freqs, inverse, stream);
  else launch<1>(x, rows, heads, row_stride, head_stride, dim, positions, freqs, inverse, stream);
}

}  // namespace dsv41::cuda
