// RoPE (rope.h): one thread per rotated pair; traffic 16 bytes per pair (read and written), the
// pass-through channels untouched. The angle and the rotation are the CPU op's operations in its
// order (no FMA contraction: --fmad=false), with CUDA's full-precision cosf/sinf (within 2 units
// in the last place; not the fast intrinsics) in place of the C library's.
#include "train/cuda/rope.h"

#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"

namespace dsv41::train_cuda {

namespace {

__global__ void rope_kernel(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t half,
                            const int64_t* positions, const float* freqs, bool inverse) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * heads * half) return;
  const int64_t i = id % half, h = id / half % heads, r = id / half / heads;
  float* pair = x + (r * heads + h) * head_dim + head_dim - 2 * half + 2 * i;
  const float angle = __fmul_rn(float(positions[r]), freqs[i]);
  const float c = cosf(angle), s = inverse ? -sinf(angle) : sinf(angle);
  const float a = pair[0], b = pair[1];
  pair[0] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  pair[1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

}  // namespace

void rope_forward(float* x, int64_t rows, int64_t heads, int64_t head_dim, int64_t rope_dim, const int64_t* positions,
                  const float* freqs, bool inverse, cudaStream_t stream) {
  if (rope_dim % 2 != 0 || rope_dim > head_dim)
    fail("train_cuda::rope_forward", "an even rope_dim <= head_dim " + std::to_string(head_dim), std::to_string(rope_dim));
  const int64_t n = rows * heads * (rope_dim / 2);
  if (n <= 0) return;
  rope_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, rows, heads, head_dim, rope_dim / 2, positions, freqs,
                                                             inverse);
  cuda::check_launch("train_cuda::rope_forward");
}

}  // namespace dsv41::train_cuda
