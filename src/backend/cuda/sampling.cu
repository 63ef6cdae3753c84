// Token choice on the device (sampling.h). Greedy rows without logprobs need only their argmax:
// one block per row reads it once (rows × vocab × 4 bytes). Any other row is sorted first (CUB's
// segmented radix sort, stable, descending: the CPU's candidate order), then one block per row
// walks the sorted candidates: the softmax's sum at the temperature, the kept prefix (top-k, then
// min-p and top-p as the CPU's loop stops), the point u × mass, and the logprobs at temperature 1.
// Traffic: the sort's passes over rows × vocab (key, id) pairs, then two or three reads of the kept
// prefix. What comes back: a token, a logprob and up to kMaxTopLogprobs alternatives per row.
// A request's logit edits (logit_bias, penalties: a few hundred tokens) go first, one thread each;
// then its token mask (a grammar's: a dense bitmask of the vocabulary, uploaded per step, vocab/8
// bytes a row) sets the disallowed logits to -inf.
#include "backend/cuda/sampling.h"

#include <cub/cub.cuh>

#include <limits>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"

namespace dsv41::cuda {

namespace {

// Per block: a row. 256 threads keep the fp64 walk's registers within one block's share.
constexpr int kThreads = 256;

struct Row {
  float temperature, top_p, min_p;
  int top_k, top_logprobs;
  double u;
  int64_t vocab, row;
};

struct Chosen {
  int token;
  float logprob;
  int top_ids[kMaxTopLogprobs];
  float top_logprobs[kMaxTopLogprobs];
};

// The larger value, the lower index on ties: max_element's first maximum.
struct Best {
  float value;
  int index;
};
struct TakeBest {
  __device__ Best operator()(const Best& a, const Best& b) const {
    return a.value > b.value || (a.value == b.value && a.index < b.index) ? a : b;
  }
};

struct Lowest {
  __device__ int64_t operator()(int64_t a, int64_t b) const { return a < b ? a : b; }
};

// One logit edit at its place in the logits: model/sampling.h's edited(), the CPU's own steps in
// fp32 (no contraction: the library is built with --fmad=false).
struct EditAt {
  int64_t at;
  LogitEdit e;
};
__global__ void __launch_bounds__(kThreads) edit_logits(float* logits, const EditAt* edits, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  logits[edits[i].at] = edited(logits[edits[i].at], edits[i].e);
}

// A masked row: its logits row, its vocabulary, and where its mask's words start.
struct MaskRow {
  int64_t row, vocab, offset;
};
__global__ void __launch_bounds__(kThreads) mask_logits(float* logits, int64_t stride, const MaskRow* rows, const uint32_t* words) {
  const MaskRow r = rows[blockIdx.y];
  for (int64_t t = blockIdx.x * int64_t(kThreads) + threadIdx.x; t < r.vocab; t += int64_t(gridDim.x) * kThreads)
    if (!((words[r.offset + t / 32] >> (t % 32)) & 1u)) logits[r.row * stride + t] = -INFINITY;
}

__global__ void __launch_bounds__(kThreads) argmax_rows(const float* logits, int64_t stride, const Row* rows, Chosen* out) {
  const Row r = rows[blockIdx.x];
  const float* x = logits + r.row * stride;
  Best best{-INFINITY, int(r.vocab)};
  for (int64_t i = threadIdx.x; i < r.vocab; i += kThreads) best = TakeBest()(best, Best{x[i], int(i)});
  using Reduce = cub::BlockReduce<Best, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  best = Reduce(tmp).Reduce(best, TakeBest());
  if (threadIdx.x == 0) out[blockIdx.x].token = best.index;
}

__global__ void fill_ids(int32_t* ids, int64_t stride, const Row* rows) {
  const Row r = rows[blockIdx.y];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < r.vocab; i += int64_t(gridDim.x) * blockDim.x)
    ids[r.row * stride + i] = int32_t(i);
}

// Over the sorted candidates `key` (descending) and their ids.
__global__ void __launch_bounds__(kThreads) choose_sorted(const float* keys, const int32_t* ids, int64_t stride, const Row* rows, Chosen* out) {
  const Row r = rows[blockIdx.x];
  const float* k = keys + r.row * stride;
  const int32_t* id = ids + r.row * stride;
  using Reduce = cub::BlockReduce<double, kThreads>;
  using ReduceIndex = cub::BlockReduce<int64_t, kThreads>;
  using Scan = cub::BlockScan<double, kThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename ReduceIndex::TempStorage index;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ double shared_d;
  __shared__ int64_t shared_i;
  const float m = k[0];
  int64_t chosen = 0;
  if (r.temperature > 0) {
    const int64_t keep = r.top_k > 0 ? min(int64_t(r.top_k), r.vocab) : r.vocab;
    const double T = r.temperature;
    double local = 0;
    for (int64_t i = threadIdx.x; i < keep; i += kThreads) local += exp(double(k[i] - m) / T);
    double sum = Reduce(tmp.reduce).Sum(local);
    if (threadIdx.x == 0) shared_d = sum;
    __syncthreads();
    sum = shared_d;
    const double p0 = 1.0 / sum;
    // Each thread a contiguous run of candidates, its start's mass from a scan of the runs' sums.
    const int64_t per = (keep + kThreads - 1) / kThreads, lo = min(keep, threadIdx.x * per), hi = min(keep, lo + per);
    double run = 0;
    for (int64_t i = lo; i < hi; ++i) run += exp(double(k[i] - m) / T) / sum;
    double before = 0;
    Scan(tmp.scan).ExclusiveSum(run, before);
    __syncthreads();
    // n: the first candidate past the first that the CPU's loop stops at, or keep.
    int64_t stop = keep;
    double mass = before;
    for (int64_t i = lo; i < hi; ++i) {
      const double p = exp(double(k[i] - m) / T) / sum;
      if (i > 0 && !(mass < r.top_p && p >= r.min_p * p0 && p > 0)) {  // (a masked token's p is 0: never kept)
        stop = i;
        break;
      }
      mass += p;
    }
    int64_t n = ReduceIndex(tmp.index).Reduce(stop, Lowest());
    if (threadIdx.x == 0) shared_i = n;
    __syncthreads();
    n = shared_i;
    // The kept prefix's mass, then the first candidate whose cumulative mass passes u × it.
    double kept = 0;
    for (int64_t i = lo; i < min(hi, n); ++i) kept += exp(double(k[i] - m) / T) / sum;
    double total = Reduce(tmp.reduce).Sum(kept);
    if (threadIdx.x == 0) shared_d = total;
    __syncthreads();
    const double target = r.u * shared_d;
    Scan(tmp.scan).ExclusiveSum(kept, before);
    __syncthreads();
    int64_t pick = n - 1;
    double acc = before;
    for (int64_t i = lo; i < min(hi, n); ++i) {
      acc += exp(double(k[i] - m) / T) / sum;
      if (target < acc) {
        pick = i;
        break;
      }
    }
    chosen = ReduceIndex(tmp.index).Reduce(pick, Lowest());
    if (threadIdx.x == 0) shared_i = chosen;
    __syncthreads();
    chosen = shared_i;
  }
  Chosen& o = out[blockIdx.x];
  if (threadIdx.x == 0) o.token = id[chosen];
  if (r.top_logprobs < 0) return;
  double local = 0;
  for (int64_t i = threadIdx.x; i < r.vocab; i += kThreads) local += exp(double(k[i] - m));
  const double z = Reduce(tmp.reduce).Sum(local);
  if (threadIdx.x == 0) {
    const float log_z = m + float(log(z));
    o.logprob = k[chosen] - log_z;
    for (int j = 0; j < r.top_logprobs && j < r.vocab; ++j) {
      o.top_ids[j] = id[j];
      o.top_logprobs[j] = k[j] - log_z;
    }
  }
}

}  // namespace

std::vector<TokenChoice> choose(float* logits, int64_t stride, std::span<const int64_t> rows,
                                std::span<const SampleRequest> requests, cudaStream_t stream) {
  if (rows.size() != requests.size())
    fail("cuda::choose", std::to_string(requests.size()) + " logits rows, one per request", std::to_string(rows.size()));
  const int n = int(requests.size());
  if (n == 0) return {};
  std::vector<Row> host;
  bool sort = false;
  int64_t last_row = 0;
  for (int i = 0; i < n; ++i) {
    const SampleRequest& q = requests[size_t(i)];
    if (q.vocab < 1 || q.vocab > stride || q.top_logprobs > kMaxTopLogprobs)
      fail("cuda::choose", "1 to " + std::to_string(stride) + " ids and at most " + std::to_string(kMaxTopLogprobs) + " top logprobs",
           std::to_string(q.vocab) + " ids, " + std::to_string(q.top_logprobs) + " top logprobs");
    host.push_back(Row{q.params.temperature, q.params.top_p, q.params.min_p, q.params.top_k, q.top_logprobs, q.u, q.vocab, rows[size_t(i)]});
    sort = sort || q.params.temperature > 0 || q.top_logprobs >= 0;
    last_row = std::max(last_row, rows[size_t(i)]);
  }
  std::vector<EditAt> edits;
  for (int i = 0; i < n; ++i) {
    const SampleRequest& q = requests[size_t(i)];
    check_edits(q.edits, q.vocab);
    for (const LogitEdit& e : q.edits) edits.push_back(EditAt{rows[size_t(i)] * stride + e.token, e});
  }
  if (!edits.empty()) {
    DeviceBuffer<EditAt> edits_d = scratch_from(edits, stream);
    const int blocks = int((edits.size() + kThreads - 1) / kThreads);
    edit_logits<<<blocks, kThreads, 0, stream>>>(logits, edits_d.get(), int64_t(edits.size()));
    check(cudaGetLastError(), "cuda::choose edits");
  }
  std::vector<MaskRow> masked;
  std::vector<uint32_t> words;
  for (int i = 0; i < n; ++i) {
    const SampleRequest& q = requests[size_t(i)];
    if (!q.allowed) continue;
    check_mask(*q.allowed, q.vocab);
    masked.push_back(MaskRow{rows[size_t(i)], q.vocab, int64_t(words.size())});
    words.insert(words.end(), q.allowed->begin(), q.allowed->begin() + (q.vocab + 31) / 32);
  }
  if (!masked.empty()) {
    DeviceBuffer<MaskRow> masked_d = scratch_from(masked, stream);
    DeviceBuffer<uint32_t> words_d = scratch_from(words, stream);
    mask_logits<<<dim3(64, unsigned(masked.size())), kThreads, 0, stream>>>(logits, stride, masked_d.get(), words_d.get());
    check(cudaGetLastError(), "cuda::choose mask");
  }
  DeviceBuffer<Row> rows_d = scratch_from(host, stream);
  DeviceBuffer<Chosen> out = scratch<Chosen>(n, stream);
  if (!sort) {
    argmax_rows<<<n, kThreads, 0, stream>>>(logits, stride, rows_d.get(), out.get());
    check(cudaGetLastError(), "cuda::choose argmax");
  } else {
    // The sort's segments are the requests' rows, in place in buffers as long as the logits up to
    // the last of them.
    const int64_t items = (last_row + 1) * stride;
    if (items > std::numeric_limits<int>::max())  // CUB's item count here is an int
      fail("cuda::choose", "sampled rows within the first " + std::to_string(std::numeric_limits<int>::max() / stride) + " logits rows",
           "row " + std::to_string(last_row));
    std::vector<int64_t> begin, end;
    for (const Row& r : host) begin.push_back(r.row * stride), end.push_back(r.row * stride + r.vocab);
    DeviceBuffer<int64_t> begin_d = scratch_from(begin, stream), end_d = scratch_from(end, stream);
    DeviceBuffer<int32_t> ids = scratch<int32_t>(items, stream), sorted_ids = scratch<int32_t>(items, stream);
    DeviceBuffer<float> keys = scratch<float>(items, stream);
    fill_ids<<<dim3(64, unsigned(n)), 256, 0, stream>>>(ids.get(), stride, rows_d.get());
    check(cudaGetLastError(), "cuda::choose ids");
    size_t bytes = 0;
    check(cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, bytes, logits, keys.get(), ids.get(), sorted_ids.get(), items, n,
                                                             begin_d.get(), end_d.get(), 0, 32, stream),
          "cuda::choose sort");
    DeviceBuffer<uint8_t> temp = scratch<uint8_t>(int64_t(std::max<size_t>(bytes, 1)), stream);
    check(cub::DeviceSegmentedRadixSort::SortPairsDescending(temp.get(), bytes, logits, keys.get(), ids.get(), sorted_ids.get(), items, n,
                                                             begin_d.get(), end_d.get(), 0, 32, stream),
          "cuda::choose sort");
    choose_sorted<<<n, kThreads, 0, stream>>>(keys.get(), sorted_ids.get(), stride, rows_d.get(), out.get());
    check(cudaGetLastError(), "cuda::choose");
  }
  const std::vector<Chosen> chosen = out.download(stream);
  std::vector<TokenChoice> result(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const Chosen& c = chosen[size_t(i)];
    TokenChoice& t = result[size_t(i)];
    t.token = c.token;
    if (host[size_t(i)].top_logprobs < 0) continue;
    t.logprob = c.logprob;
    for (int j = 0; j < host[size_t(i)].top_logprobs && j < host[size_t(i)].vocab; ++j)
      if (c.top_logprobs[j] != -INFINITY) t.top.emplace_back(c.top_ids[j], c.top_logprobs[j]);  // (a masked token is no alternative)
  }
  return result;
}

}  // namespace dsv41::cuda
