// The cross-entropy over the logits (cross_entropy.h).
//
// Forward: one block per row of the whole batch reads the row twice (its maximum, then the sum of
// exp(z − m); the second pass from L2 for rows up to a few MB), 8·rows·vocab bytes; one block per
// sequence then adds its rows' losses in a fixed order (the order depends only on the sequence's
// rows, so its loss has the bits it has alone). Backward: one block per row (its sequence's share
// found once), a thread per logit of it; the probabilities: one thread per logit; 8 bytes a logit
// (z read, dz or p written). The CPU op's operations in its order (--fmad=false), with CUDA's
// full-precision expf and logf (within 2 units in the last place); the sums' order differs.
#include "train/cuda/cross_entropy.h"

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 512;
constexpr int kBackwardThreads = 256;

__device__ inline bool counted(int64_t t, int64_t vocab) { return t >= 0 && t < vocab; }

__global__ void __launch_bounds__(kThreads) row_kernel(const float* logits, int64_t vocab, const int64_t* targets,
                                                       float* row_max, float* row_sum, float* row_loss) {
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  const float* z = logits + row * vocab;
  float m = -INFINITY;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) m = fmaxf(m, z[v]);
  m = block_max<kThreads>(m, scratch);
  float s = 0;
  for (int64_t v = threadIdx.x; v < vocab; v += kThreads) s = __fadd_rn(s, expf(__fsub_rn(z[v], m)));
  s = block_sum<kThreads>(s, scratch);
  if (threadIdx.x != 0) return;
  row_max[row] = m;
  row_sum[row] = s;
  const int64_t t = targets[row];
  row_loss[row] = t == -1 ? 0.0f : counted(t, vocab) ? __fsub_rn(__fadd_rn(m, logf(s)), z[t]) : __int_as_float(0x7FC00000);
}

// loss[2s, 2s + 1] = {Σ counted row losses / n, n} over sequence s's rows: one block per sequence,
// its rows in a fixed order.
__global__ void __launch_bounds__(kThreads) total_kernel(const float* row_loss, const int64_t* begin, const int64_t* targets,
                                                         float* loss) {
  __shared__ float scratch[kThreads / 32];
  const int64_t s = blockIdx.x, first = begin[s], rows = begin[s + 1] - first;
  float total = 0, n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kThreads)
    if (targets[first + r] != -1) total = __fadd_rn(total, row_loss[first + r]), n = __fadd_rn(n, 1.0f);
  total = block_sum<kThreads>(total, scratch);
  n = block_sum<kThreads>(n, scratch);
  if (threadIdx.x == 0) loss[2 * s] = n > 0 ? __fdiv_rn(total, n) : 0.0f, loss[2 * s + 1] = n;
}

__global__ void __launch_bounds__(kBackwardThreads) backward_kernel(const float* logits, int64_t vocab, const int64_t* targets,
                                                                    const int64_t* begin, int64_t sequences,
                                                                    const float* row_max, const float* row_sum,
                                                                    const float* loss, float dloss, float* dlogits) {
  const int64_t r = blockIdx.x, t = targets[r];
  const float* z = logits + r * vocab;
  float* dz = dlogits + r * vocab;
  if (!counted(t, vocab)) {
    for (int64_t v = threadIdx.x; v < vocab; v += kBackwardThreads) dz[v] = 0.0f;
    return;
  }
  const float share = __fdiv_rn(dloss, loss[2 * segment_of(begin, sequences, r) + 1]);
  for (int64_t v = threadIdx.x; v < vocab; v += kBackwardThreads) {
    const float p = __fdiv_rn(expf(__fsub_rn(z[v], row_max[r])), row_sum[r]);
    const float g = __fmul_rn(share, p);
    dz[v] = v == t ? __fsub_rn(g, share) : g;
  }
}

__global__ void probabilities_kernel(const float* logits, int64_t vocab, const float* row_max, const float* row_sum,
                                     const int64_t* rows, int64_t n, float* p) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * vocab) return;
  const int64_t i = e / vocab, r = rows[i];
  p[e] = __fdiv_rn(expf(__fsub_rn(logits[r * vocab + e - i * vocab], row_max[r])), row_sum[r]);
}

}  // namespace

void cross_entropy_forward(const float* logits, int64_t rows, int64_t vocab, const int64_t* targets, const int64_t* begin,
                           int64_t sequences, float* row_max, float* row_sum, float* loss, cudaStream_t stream) {
  if (sequences <= 0) return;
  cuda::DeviceBuffer<float> row_loss = cuda::scratch<float>(rows, stream);
  if (rows > 0) {
    row_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, vocab, targets, row_max, row_sum, row_loss.get());
    cuda::check_launch("train_cuda::cross_entropy_forward");
  }
  total_kernel<<<unsigned(sequences), kThreads, 0, stream>>>(row_loss.get(), begin, targets, loss);
  cuda::check_launch("train_cuda::cross_entropy_forward");
}

void cross_entropy_backward(const float* logits, int64_t rows, int64_t vocab, const int64_t* targets, const int64_t* begin,
                            int64_t sequences, const float* row_max, const float* row_sum, const float* loss, float dloss,
                            float* dlogits, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return;
  backward_kernel<<<unsigned(rows), kBackwardThreads, 0, stream>>>(logits, vocab, targets, begin, sequences, row_max, row_sum,
                                                                   loss, dloss, dlogits);
  cuda::check_launch("train_cuda::cross_entropy_backward");
}

void cross_entropy_probabilities(const float* logits, int64_t vocab, const float* row_max, const float* row_sum,
                                 const int64_t* rows, int64_t n, float* p, cudaStream_t stream) {
  const int64_t total = n * vocab;
  if (total <= 0) return;
  probabilities_kernel<<<unsigned((total + 255) / 256), 256, 0, stream>>>(logits, vocab, row_max, row_sum, rows, n, p);
  cuda::check_launch("train_cuda::cross_entropy_probabilities");
}

}  // namespace dsv41::train_cuda
