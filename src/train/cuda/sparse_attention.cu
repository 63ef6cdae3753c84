// Sparse attention with a sink (sparse_attention.h): a plain fp32 kernel, one block per (row,
// head), written for correctness and determinism, not speed (the tensor-core form is left:
// docs/training.md, "The CUDA op set").
//
// Forward: q_h into shared memory; each thread scores its entries (a sequential dot of d, the CPU's
// order, so the scores are the CPU's bits), the block's maximum, the exponentials, the normalizer
// summed by one thread in entry order (a few hundred adds), then each thread one channel of o over
// the entries in order. Reads per block: q_h, the listed kv rows twice (from L2: every head of a
// row reads the same rows), idx; writes o_h and the probabilities.
// Backward: (1) per (row, head): dp_j by sequential dots, D in entry order by one thread, the
// scaled ds_j written to scratch, dq's channels over the entries in order, the sink's term per
// (row, head) to scratch; (2) dsink: one thread per head adds the rows' terms in row order;
// (3) dkv: the listed ids sorted with their (row, slot) by CUB's stable radix sort, and one block
// per distinct entry adds, per channel, every (row, head) that lists it, rows in order and heads in
// order within a row — the CPU loop's order of additions.
#include "train/cuda/sparse_attention.h"

#include <cub/cub.cuh>

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/reduce.cuh"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 128;
constexpr size_t kMaxShared = 48 << 10;  // the default dynamic shared-memory limit

// Dynamic shared memory: q_h (or do_h) [d], then one float per entry.
__global__ void __launch_bounds__(kThreads) forward_kernel(const float* q, int64_t heads, int64_t d, const float* kv,
                                                           const int64_t* idx, int64_t entries, const float* sink,
                                                           float scale, float* o, float* p_out, float* sink_out) {
  extern __shared__ float shared[];
  float *qs = shared, *ps = shared + d;
  __shared__ float scratch[kThreads / 32];
  __shared__ float z_shared;
  const int64_t rh = blockIdx.x, h = rh % heads;
  const int64_t* list = idx + rh / heads * entries;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) qs[c] = q[rh * d + c];
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < entries; j += kThreads) {
    float s = 0;  // an empty slot's probability stays 0
    if (list[j] >= 0) {
      const float* k = kv + list[j] * d;
      float dot = 0;
      for (int64_t c = 0; c < d; ++c) dot = __fadd_rn(dot, __fmul_rn(qs[c], k[c]));
      s = __fmul_rn(dot, scale);
      mx = fmaxf(mx, s);
    }
    ps[j] = s;
  }
  // The largest exponent, the sink's included, keeps every exp at most 1. (block_max's barriers
  // also publish ps.)
  mx = fmaxf(block_max<kThreads>(mx, scratch), sink[h]);
  for (int64_t j = threadIdx.x; j < entries; j += kThreads)
    if (list[j] >= 0) ps[j] = expf(__fsub_rn(ps[j], mx));
  __syncthreads();
  if (threadIdx.x == 0) {
    const float sink_e = expf(__fsub_rn(sink[h], mx));
    float z = sink_e;
    for (int64_t j = 0; j < entries; ++j)
      if (list[j] >= 0) z = __fadd_rn(z, ps[j]);
    z_shared = z;
    sink_out[rh] = __fdiv_rn(sink_e, z);
  }
  __syncthreads();
  const float z = z_shared;
  for (int64_t j = threadIdx.x; j < entries; j += kThreads) {
    if (list[j] >= 0) ps[j] = __fdiv_rn(ps[j], z);
    p_out[rh * entries + j] = ps[j];
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    float acc = 0;
    for (int64_t j = 0; j < entries; ++j)
      if (list[j] >= 0) acc = __fadd_rn(acc, __fmul_rn(ps[j], kv[list[j] * d + c]));
    o[rh * d + c] = acc;
  }
}

// Per (row, head): g [rows, heads, entries] = p_j (dp_j − D) · scale (0 for an empty slot),
// sink_term [rows, heads] = p_sink · D, and dq_h += Σ_j g_j kv_j.
__global__ void __launch_bounds__(kThreads) backward_rows_kernel(int64_t heads, int64_t d, const float* kv,
                                                                 const int64_t* idx, int64_t entries, float scale,
                                                                 const float* p, const float* sink_p, const float* dout,
                                                                 float* dq, float* g, float* sink_term) {
  extern __shared__ float shared[];
  float *dos = shared, *gs = shared + d;
  __shared__ float D_shared;
  const int64_t rh = blockIdx.x;
  const int64_t* list = idx + rh / heads * entries;
  const float* pr = p + rh * entries;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) dos[c] = dout[rh * d + c];
  __syncthreads();
  for (int64_t j = threadIdx.x; j < entries; j += kThreads) {
    float dp = 0;
    if (list[j] >= 0) {
      const float* k = kv + list[j] * d;
      for (int64_t c = 0; c < d; ++c) dp = __fadd_rn(dp, __fmul_rn(dos[c], k[c]));
    }
    gs[j] = dp;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float D = 0;
    for (int64_t j = 0; j < entries; ++j)
      if (list[j] >= 0) D = __fadd_rn(D, __fmul_rn(pr[j], gs[j]));
    D_shared = D;
    sink_term[rh] = __fmul_rn(sink_p[rh], D);
  }
  __syncthreads();
  const float D = D_shared;
  for (int64_t j = threadIdx.x; j < entries; j += kThreads) {
    const float gj = list[j] >= 0 ? __fmul_rn(__fmul_rn(pr[j], __fsub_rn(gs[j], D)), scale) : 0.0f;
    gs[j] = gj;
    g[rh * entries + j] = gj;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    float acc = dq[rh * d + c];
    for (int64_t j = 0; j < entries; ++j)
      if (list[j] >= 0) acc = __fadd_rn(acc, __fmul_rn(gs[j], kv[list[j] * d + c]));
    dq[rh * d + c] = acc;
  }
}

// dsink[h] −= sink_term[r, h] for r in order.
__global__ void dsink_kernel(const float* sink_term, int64_t rows, int64_t heads, float* dsink) {
  const int64_t h = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (h >= heads) return;
  float s = dsink[h];
  for (int64_t r = 0; r < rows; ++r) s = __fsub_rn(s, sink_term[r * heads + h]);
  dsink[h] = s;
}

// keys[f] = idx[f] (or n when outside [0, n)), slots[f] = f, over the flat [rows, entries] lists.
__global__ void keys_kernel(const int64_t* idx, int64_t count, int64_t n, uint64_t* keys, int32_t* slots) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f >= count) return;
  keys[f] = uint64_t(idx[f] >= 0 && idx[f] < n ? idx[f] : n);
  slots[f] = int32_t(f);
}

// The first block of each run of equal keys: dkv[key] += Σ over the run's (row, slot), rows in
// order, and the row's heads in order, of g · q_h + p · do_h.
__global__ void __launch_bounds__(kThreads) dkv_kernel(const uint64_t* keys, const int32_t* slots, int64_t count, int64_t n,
                                                       int64_t heads, int64_t d, int64_t entries, const float* q,
                                                       const float* p, const float* dout, const float* g, float* dkv) {
  const int64_t first = blockIdx.x;
  const uint64_t key = keys[first];
  if (key == uint64_t(n) || (first > 0 && keys[first - 1] == key)) return;
  for (int64_t c = threadIdx.x; c < d; c += kThreads) {
    float acc = dkv[int64_t(key) * d + c];
    for (int64_t t = first; t < count && keys[t] == key; ++t) {
      const int64_t r = slots[t] / entries, j = slots[t] % entries;
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t rh = r * heads + h;
        acc = __fadd_rn(acc, __fadd_rn(__fmul_rn(g[rh * entries + j], q[rh * d + c]),
                                       __fmul_rn(p[rh * entries + j], dout[rh * d + c])));
      }
    }
    dkv[int64_t(key) * d + c] = acc;
  }
}

size_t shared_bytes(int64_t d, int64_t entries, const char* where) {
  const size_t bytes = size_t(d + entries) * sizeof(float);
  if (bytes > kMaxShared)
    fail(where, "head_dim + entries <= " + std::to_string(kMaxShared / sizeof(float)),
         std::to_string(d) + " + " + std::to_string(entries));
  return bytes;
}

}  // namespace

void sparse_attention_forward(const float* q, int64_t rows, int64_t heads, int64_t d, const float* kv, const int64_t* idx,
                              int64_t entries, const float* sink, float scale, float* o, float* p, float* sink_p,
                              cudaStream_t stream) {
  if (rows <= 0 || heads <= 0) return;
  const size_t smem = shared_bytes(d, entries, "train_cuda::sparse_attention_forward");
  forward_kernel<<<unsigned(rows * heads), kThreads, smem, stream>>>(q, heads, d, kv, idx, entries, sink, scale, o, p,
                                                                      sink_p);
  cuda::check_launch("train_cuda::sparse_attention_forward");
}

void sparse_attention_backward(const float* q, int64_t rows, int64_t heads, int64_t d, const float* kv, int64_t n,
                               const int64_t* idx, int64_t entries, float scale, const float* p, const float* sink_p,
                               const float* dout, float* dq, float* dkv, float* dsink, cudaStream_t stream) {
  if (rows <= 0 || heads <= 0 || entries <= 0) return;
  const char* where = "train_cuda::sparse_attention_backward";
  const size_t smem = shared_bytes(d, entries, where);
  const int64_t count = rows * entries;
  if (count > INT32_MAX) fail(where, "rows · entries < 2^31", std::to_string(count));
  cuda::DeviceBuffer<float> g = cuda::scratch<float>(rows * heads * entries, stream);
  cuda::DeviceBuffer<float> sink_term = cuda::scratch<float>(rows * heads, stream);
  backward_rows_kernel<<<unsigned(rows * heads), kThreads, smem, stream>>>(heads, d, kv, idx, entries, scale, p, sink_p,
                                                                            dout, dq, g.get(), sink_term.get());
  cuda::check_launch(where);
  dsink_kernel<<<unsigned((heads + 127) / 128), 128, 0, stream>>>(sink_term.get(), rows, heads, dsink);
  cuda::check_launch(where);

  int end_bit = 1;  // the bits of the largest key, n
  while (end_bit < 63 && (int64_t(1) << end_bit) <= n) ++end_bit;
  cuda::DeviceBuffer<uint64_t> keys = cuda::scratch<uint64_t>(count, stream), sorted_keys = cuda::scratch<uint64_t>(count, stream);
  cuda::DeviceBuffer<int32_t> slots = cuda::scratch<int32_t>(count, stream), sorted_slots = cuda::scratch<int32_t>(count, stream);
  keys_kernel<<<unsigned((count + 255) / 256), 256, 0, stream>>>(idx, count, n, keys.get(), slots.get());
  cuda::check_launch(where);
  size_t bytes = 0;
  cuda::check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.get(), sorted_keys.get(), slots.get(), sorted_slots.get(),
                                              count, 0, end_bit, stream),
              where);
  cuda::DeviceBuffer<uint8_t> temp = cuda::scratch<uint8_t>(int64_t(bytes), stream);
  cuda::check(cub::DeviceRadixSort::SortPairs(temp.get(), bytes, keys.get(), sorted_keys.get(), slots.get(), sorted_slots.get(),
                                              count, 0, end_bit, stream),
              where);
  dkv_kernel<<<unsigned(count), kThreads, 0, stream>>>(sorted_keys.get(), sorted_slots.get(), count, n, heads, d, entries, q,
                                                       p, dout, g.get(), dkv);
  cuda::check_launch(where);
}

}  // namespace dsv41::train_cuda
