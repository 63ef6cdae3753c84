// The indexer's scores, their backward, the attention target and the distillation loss
// (indexer.h): plain fp32 kernels with the CPU loop's operations in its order, so everything but
// the loss and its gradient (expf, logf) is the CPU's bits.
//
// Scores: one block per row, a thread per chosen entry, the heads' dot products over d in
// sequence; reads the row's q (heads·d) once per entry from L1/L2 and each key row once.
// Backward: one block per (row, head): the dots again, dw and dq over the entries in order; then
// the keys' gradient as the sparse attention's dkv: the listed ids sorted stably with their
// (row, slot), one block per key, rows in order and heads in order. Target: one block per row.
// Loss: one thread per row of the whole batch, then one thread per sequence adds its rows' losses
// in order; its backward: one thread per row.
#include "train/cuda/indexer.h"

#include <cub/cub.cuh>

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 128;
constexpr size_t kMaxShared = 48 << 10;

__device__ inline float dot_of(const float* a, const float* b, int64_t d) {
  float dot = 0;
  for (int64_t c = 0; c < d; ++c) dot = __fadd_rn(dot, __fmul_rn(a[c], b[c]));
  return dot;
}

__global__ void __launch_bounds__(kThreads) scores_kernel(const float* q, const float* w, const float* keys, const int64_t* idx,
                                                          int64_t heads, int64_t d, int64_t k, float* scores) {
  const int64_t r = blockIdx.x;
  for (int64_t j = threadIdx.x; j < k; j += kThreads) {
    const int64_t t = idx[r * k + j];
    if (t < 0) {
      scores[r * k + j] = -INFINITY;
      continue;
    }
    float sum = 0;
    for (int64_t h = 0; h < heads; ++h) {
      const float dot = dot_of(q + (r * heads + h) * d, keys + t * d, d);
      sum = __fadd_rn(sum, __fmul_rn(dot < 0.0f ? 0.0f : dot, w[r * heads + h]));  // std::max(dot, 0)'s choice
    }
    scores[r * k + j] = sum;
  }
}

// Per (row, head): dot [rows, heads, k] = q_h · k_t where positive, else 0 (the relu passes no
// gradient there); dw_h and dq_h over the entries in order. Dynamic shared memory: dot [k].
__global__ void __launch_bounds__(kThreads) backward_rows_kernel(const float* q, const float* w, const float* keys,
                                                                 const int64_t* idx, int64_t heads, int64_t d, int64_t k,
                                                                 const float* dscores, float* dq, float* dw, float* dot_out) {
  extern __shared__ float dots[];
  const int64_t rh = blockIdx.x, r = rh / heads;
  const int64_t* list = idx + r * k;
  const float* qh = q + rh * d;
  for (int64_t j = threadIdx.x; j < k; j += kThreads) {
    const float dot = list[j] >= 0 ? dot_of(qh, keys + list[j] * d, d) : 0.0f;
    dots[j] = dot > 0.0f ? dot : 0.0f;
    dot_out[rh * k + j] = dots[j];
  }
  __syncthreads();
  const float* g = dscores + r * k;
  if (threadIdx.x == 0) {
    float acc = dw[rh];
    for (int64_t j = 0; j < k; ++j)
      if (dots[j] > 0.0f) acc = __fadd_rn(acc, __fmul_rn(g[j], dots[j]));
    dw[rh] = acc;
  }
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    float acc = dq[rh * d + c];
    for (int64_t j = 0; j < k; ++j)
      if (dots[j] > 0.0f) acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(g[j], w[rh]), keys[list[j] * d + c]));
    dq[rh * d + c] = acc;
  }
}

__global__ void keys_kernel(const int64_t* idx, int64_t count, int64_t n, uint64_t* sort_keys, int32_t* slots) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= count) return;
  sort_keys[f] = uint64_t(idx[f] >= 0 && idx[f] < n ? idx[f] : n);
  slots[f] = int32_t(f);
}

// The first block of each run of equal ids: dkeys[t] += Σ over the run's (row, slot), rows in
// order, and the row's heads in order where the dot was positive, of dI · w_h · q_h.
__global__ void __launch_bounds__(kThreads) dkeys_kernel(const uint64_t* sort_keys, const int32_t* slots, int64_t count,
                                                         int64_t n, int64_t heads, int64_t d, int64_t k, const float* q,
                                                         const float* w, const float* dscores, const float* dots,
                                                         float* dkeys) {
  const int64_t first = blockIdx.x;
  const uint64_t key = sort_keys[first];
  if (key == uint64_t(n) || (first > 0 && sort_keys[first - 1] == key)) return;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    float acc = dkeys[int64_t(key) * d + c];
    for (int64_t t = first; t < count && sort_keys[t] == key; ++t) {
      const int64_t r = slots[t] / k, j = slots[t] % k;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t rh = r * heads + h;
        if (dots[rh * k + j] > 0.0f)
          acc = __fadd_rn(acc, __fmul_rn(__fmul_rn(dscores[r * k + j], w[rh]), q[rh * d + c]));
      }
    }
    dkeys[int64_t(key) * d + c] = acc;
  }
}

// Dynamic shared memory: mass [k].
__global__ void __launch_bounds__(kThreads) target_kernel(const float* p, int64_t heads, int64_t entries, int64_t first,
                                                          int64_t k, float* target) {
  extern __shared__ float mass[];
  __shared__ float sum_shared;
  const int64_t r = blockIdx.x;
  for (int64_t j = threadIdx.x; j < k; j += kThreads) {
    float m = 0;
    for (int64_t h = 0; h < heads; ++h) m = __fadd_rn(m, p[(r * heads + h) * entries + first + j]);
    mass[j] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) sum = __fadd_rn(sum, mass[j]);
    sum_shared = sum;
  }
  __syncthreads();
  const float sum = sum_shared;
  for (int64_t j = threadIdx.x; j < k; j += kThreads) target[r * k + j] = sum > 0.0f ? __fdiv_rn(mass[j], sum) : 0.0f;
}

// Row r's KL(target ‖ softmax(scores)) into row_loss[r] (forward), or (backward, row_loss nullptr)
// dscores[r] += (dloss / n_s) · (softmax − target) with s its sequence.
__global__ void loss_rows_kernel(const float* scores, const float* target, int64_t rows, int64_t k, const int64_t* begin,
                                 int64_t sequences, float dloss, float* row_loss, float* dscores) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float *s = scores + r * k, *p = target + r * k;
  float mx = -INFINITY, mass = 0;
  for (int64_t j = 0; j < k; ++j) mx = fmaxf(mx, s[j]), mass = __fadd_rn(mass, p[j]);
  float loss = 0;
  if (mass > 0.0f && mx != -INFINITY) {
    float z = 0;
    for (int64_t j = 0; j < k; ++j)
      if (s[j] > -INFINITY) z = __fadd_rn(z, expf(__fsub_rn(s[j], mx)));
    const float log_z = __fadd_rn(logf(z), mx);
    if (row_loss) {
      for (int64_t j = 0; j < k; ++j)
        if (s[j] != -INFINITY && p[j] > 0.0f) loss = __fadd_rn(loss, __fmul_rn(p[j], __fsub_rn(logf(p[j]), __fsub_rn(s[j], log_z))));
    } else {
      const int64_t seq = segment_of(begin, sequences, r);
      const float scale = __fdiv_rn(dloss, float(begin[seq + 1] - begin[seq]));
      for (int64_t j = 0; j < k; ++j)
        if (s[j] != -INFINITY)
          dscores[r * k + j] = __fadd_rn(dscores[r * k + j], __fmul_rn(scale, __fsub_rn(expf(__fsub_rn(s[j], log_z)), p[j])));
    }
  }
  if (row_loss) row_loss[r] = loss;
}

// loss[s] = sequence s's rows' losses added in row order: one thread per sequence.
__global__ void loss_total_kernel(const float* row_loss, const int64_t* begin, float* loss) {
  const int64_t s = blockIdx.x;
  float total = 0;
  for (int64_t r = begin[s]; r < begin[s + 1]; ++r) total = __fadd_rn(total, row_loss[r]);
  loss[s] = total;
}

size_t shared_bytes(int64_t k, const char* where) {
  const size_t bytes = size_t(k) * sizeof(float);
  if (bytes > kMaxShared) fail(where, "k <= " + std::to_string(kMaxShared / sizeof(float)), std::to_string(k));
  return bytes;
}

}  // namespace

void indexer_scores_forward(const float* q, const float* w, const float* keys, const int64_t* idx, int64_t rows, int64_t heads,
                            int64_t d, int64_t k, float* scores, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  scores_kernel<<<unsigned(rows), kThreads, 0, stream>>>(q, w, keys, idx, heads, d, k, scores);
  cuda::check_launch("train_cuda::indexer_scores_forward");
}

void indexer_scores_backward(const float* q, const float* w, const float* keys, int64_t n, const int64_t* idx, int64_t rows,
                             int64_t heads, int64_t d, int64_t k, const float* dscores, float* dq, float* dw, float* dkeys,
                             cudaStream_t stream) {
  const char* where = "train_cuda::indexer_scores_backward";
  if (rows <= 0 || heads <= 0 || k <= 0) return;
  const size_t smem = shared_bytes(k, where);
  const int64_t count = rows * k;
  if (count > INT32_MAX) fail(where, "rows · k < 2^31", std::to_string(count));
  cuda::DeviceBuffer<float> dots = cuda::scratch<float>(rows * heads * k, stream);
  backward_rows_kernel<<<unsigned(rows * heads), kThreads, smem, stream>>>(q, w, keys, idx, heads, d, k, dscores, dq, dw,
                                                                          dots.get());
  cuda::check_launch(where);
  int end_bit = 1;  // the bits of the largest sort key, n
  while (end_bit < 63 && (int64_t(1) << end_bit) <= n) ++end_bit;
  cuda::DeviceBuffer<uint64_t> sort_keys = cuda::scratch<uint64_t>(count, stream), sorted_keys = cuda::scratch<uint64_t>(count, stream);
  cuda::DeviceBuffer<int32_t> slots = cuda::scratch<int32_t>(count, stream), sorted_slots = cuda::scratch<int32_t>(count, stream);
  keys_kernel<<<unsigned((count + 255) / 256), 256, 0, stream>>>(idx, count, n, sort_keys.get(), slots.get());
  cuda::check_launch(where);
  size_t bytes = 0;
  cuda::check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, sort_keys.get(), sorted_keys.get(), slots.get(), sorted_slots.get(),
                                              count, 0, end_bit, stream),
              where);
  cuda::DeviceBuffer<uint8_t> temp = cuda::scratch<uint8_t>(int64_t(bytes), stream);
  cuda::check(cub::DeviceRadixSort::SortPairs(temp.get(), bytes, sort_keys.get(), sorted_keys.get(), slots.get(),
                                              sorted_slots.get(), count, 0, end_bit, stream),
              where);
  dkeys_kernel<<<unsigned(count), kThreads, 0, stream>>>(sorted_keys.get(), sorted_slots.get(), count, n, heads, d, k, q, w,
                                                         dscores, dots.get(), dkeys);
  cuda::check_launch(where);
}

void attention_target(const float* p, int64_t rows, int64_t heads, int64_t entries, int64_t first, int64_t k, float* target,
                      cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  const size_t smem = shared_bytes(k, "train_cuda::attention_target");
  target_kernel<<<unsigned(rows), kThreads, smem, stream>>>(p, heads, entries, first, k, target);
  cuda::check_launch("train_cuda::attention_target");
}

void index_distillation_loss(const float* scores, const float* target, int64_t rows, int64_t k, const int64_t* begin,
                             int64_t sequences, float* loss, cudaStream_t stream) {
  if (sequences <= 0) return;
  cuda::DeviceBuffer<float> row_loss = cuda::scratch<float>(rows, stream);
  if (rows > 0) {
    loss_rows_kernel<<<unsigned((rows + 127) / 128), 128, 0, stream>>>(scores, target, rows, k, begin, sequences, 0.0f,
                                                                        row_loss.get(), nullptr);
    cuda::check_launch("train_cuda::index_distillation_loss");
  }
  loss_total_kernel<<<unsigned(sequences), 1, 0, stream>>>(row_loss.get(), begin, loss);
  cuda::check_launch("train_cuda::index_distillation_loss");
}

void index_distillation_backward(const float* scores, const float* target, int64_t rows, int64_t k, const int64_t* begin,
                                 int64_t sequences, float dloss, float* dscores, cudaStream_t stream) {
  if (rows <= 0) return;
  loss_rows_kernel<<<unsigned((rows + 127) / 128), 128, 0, stream>>>(scores, target, rows, k, begin, sequences, dloss, nullptr,
                                                                      dscores);
  cuda::check_launch("train_cuda::index_distillation_backward");
}

}  // namespace dsv41::train_cuda
