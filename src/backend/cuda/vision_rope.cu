// The ViT's 2D RoPE (vision.h vision_rope; backend/cpu/vision_rope.h): one thread per (row, head,
// channel pair j < head_dim/2) of q and of k, turning channel j with channel j + head_dim/2 ("rotate
// half") by the angle of pair j: grid row · f_j for the first half of the pairs, grid column ·
// f_{j - head_dim/4} for the second. Traffic: the q and k thirds read and written once (2 · 2/3 of
// qkv's bytes), the places (8 bytes a row) and the frequencies from cache. The angle and the
// rotation are VisionRope::apply's operations in its order, with CUDA's full-precision cosf/sinf.
#include "backend/cuda/check.h"
#include "backend/cuda/vision.h"
#include "base/error.h"
#include "numerics/types.h"

#include <string>

namespace dsv41::cuda {

namespace {

// One thread per (row, q or k, head, pair): half = head_dim / 2 pairs a head.
__global__ void vision_rope_kernel(float* qkv, int64_t rows, int heads, int head_dim, const int32_t* places,
                                   const float* freqs) {
  const int half = head_dim / 2, quarter = head_dim / 4;
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= rows * 2 * heads * half) return;
  const int j = int(id % half);
  const int h = int(id / half % heads);
  const int part = int(id / half / heads % 2);  // 0: q, 1: k
  const int64_t r = id / half / heads / 2;
  const int64_t width = int64_t(heads) * head_dim;
  float* v = qkv + r * 3 * width + part * width + int64_t(h) * head_dim;
  const float angle = j < quarter ? __fmul_rn(float(places[2 * r]), freqs[j]) : __fmul_rn(float(places[2 * r + 1]), freqs[j - quarter]);
  const float c = cosf(angle), s = sinf(angle);
  const float x1 = v[j], x2 = v[j + half];
  v[j] = round_bf16(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
  v[j + half] = round_bf16(__fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
}

}  // namespace

void vision_rope(float* qkv, int64_t rows, int heads, int head_dim, const int32_t* places, const float* freqs,
                 cudaStream_t stream) {
  if (head_dim <= 0 || head_dim % 4 != 0)
    fail("cuda::vision_rope", "a head dimension that is a positive multiple of 4", std::to_string(head_dim));
  const int64_t n = rows * 2 * heads * (head_dim / 2);
  if (n <= 0) return;
  vision_rope_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(qkv, rows, heads, head_dim, places, freqs);
  check_launch("cuda::vision_rope");
}

}  // namespace dsv41::cuda
