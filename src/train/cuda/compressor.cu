// The compressor's pooling (compressor.h): one thread per (group, channel), the group's `ratio`
// values of the channel in the CPU's order (so only expf's last bits differ). Traffic per latent
// channel: 8·ratio bytes read and 4 written (forward); 16·ratio read and 8·ratio written, plus out
// and dout (backward). Consecutive threads take consecutive channels: coalesced.
#include "train/cuda/compressor.h"

#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"

namespace dsv41::train_cuda {

namespace {

__global__ void forward_kernel(const float* kv, const float* score, int64_t groups, int64_t d, int ratio, float* out) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= groups * d) return;
  const int64_t g = id / d, c = id % d, first = g * ratio * d + c;
  float mx = -INFINITY;
  for (int t = 0; t < ratio; ++t) mx = fmaxf(mx, score[first + t * d]);
  float sum = 0, acc = 0;
  for (int t = 0; t < ratio; ++t) {
    const float e = expf(__fsub_rn(score[first + t * d], mx));
    sum = __fadd_rn(sum, e);
    acc = __fadd_rn(acc, __fmul_rn(e, kv[first + t * d]));
  }
  out[id] = __fdiv_rn(acc, sum);
}

__global__ void backward_kernel(const float* kv, const float* score, int64_t groups, int64_t d, int ratio, const float* out,
                                const float* dout, float* dkv, float* dscore) {
  const int64_t id = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= groups * d) return;
  const int64_t g = id / d, c = id % d, first = g * ratio * d + c;
  float mx = -INFINITY;
  for (int t = 0; t < ratio; ++t) mx = fmaxf(mx, score[first + t * d]);
  float sum = 0;
  for (int t = 0; t < ratio; ++t) sum = __fadd_rn(sum, expf(__fsub_rn(score[first + t * d], mx)));
  const float go = dout[id];
  for (int t = 0; t < ratio; ++t) {
    const int64_t i = first + t * d;
    const float p = __fdiv_rn(expf(__fsub_rn(score[i], mx)), sum);
    dkv[i] = __fadd_rn(dkv[i], __fmul_rn(p, go));
    dscore[i] = __fadd_rn(dscore[i], __fmul_rn(__fmul_rn(p, go), __fsub_rn(kv[i], out[id])));
  }
}

}  // namespace

void compressor_pool_forward(const float* kv, const float* score, int64_t rows, int64_t d, int ratio, float* out,
                             cudaStream_t stream) {
  if (ratio < 1) fail("train_cuda::compressor_pool_forward", "ratio >= 1", std::to_string(ratio));
  const int64_t n = rows / ratio * d;
  if (n <= 0) return;
  forward_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(kv, score, rows / ratio, d, ratio, out);
  cuda::check_launch("train_cuda::compressor_pool_forward");
}

void compressor_pool_backward(const float* kv, const float* score, int64_t rows, int64_t d, int ratio, const float* out,
                              const float* dout, float* dkv, float* dscore, cudaStream_t stream) {
  if (ratio < 1) fail("train_cuda::compressor_pool_backward", "ratio >= 1", std::to_string(ratio));
  const int64_t n = rows / ratio * d;
  if (n <= 0) return;
  backward_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(kv, score, rows / ratio, d, ratio, out, dout, dkv, dscore);
  cuda::check_launch("train_cuda::compressor_pool_backward");
}

}  // namespace dsv41::train_cuda
