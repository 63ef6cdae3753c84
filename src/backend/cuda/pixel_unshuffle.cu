// The aligner's pixel unshuffle (vision.h; backend/cpu/pixel_unshuffle.h) as a gather over a table
// the host made (forward/vision_layout.h VisionLayout::unshuffle): one thread per output value
// (token t, feature c·r² + q) reads x[sources[t·r² + q]][c], or writes 0 past the grid. Exact (a
// copy). Traffic: the output written once, x read once (each patch feeds one token), the table's
// r² entries of a token once per channel, from cache.
#include "backend/cuda/check.h"
#include "backend/cuda/vision.h"

namespace dsv41::cuda {

namespace {

__global__ void unshuffle_kernel(const float* x, int64_t dim, const int32_t* sources, int64_t tokens, int rr, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= tokens * dim * rr) return;
  const int64_t q = i % rr, c = i / rr % dim, t = i / rr / dim;
  const int32_t src = sources[t * rr + q];
  out[i] = src < 0 ? 0.0f : x[int64_t(src) * dim + c];
}

}  // namespace

void pixel_unshuffle(const float* x, int64_t dim, const int32_t* sources, int64_t tokens, int r, float* out,
                     cudaStream_t stream) {
  const int64_t n = tokens * dim * r * r;
  if (n <= 0) return;
  unshuffle_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, dim, sources, tokens, r * r, out);
  check_launch("cuda::pixel_unshuffle");
}

}  // namespace dsv41::cuda
