// Row gather and its scatter-add (embedding.h).
//
// Forward: one block per output row, a row copied: 8·n·dim bytes. Backward: the ids become sort
// keys (an id outside [0, rows) the key `rows`, sorted last and skipped), sorted with their
// positions by CUB's stable radix sort over the key's bits (a few passes over 12·n bytes); then one
// block per sorted position, of which the first of each run of equal keys adds the run's gradient
// rows, in increasing position, into its table row: dout read once, each touched table row read
// and written once. No two blocks write one row, and no atomics: the same bits at every run, and
// the CPU's order of additions. Distinct ids need no sort: one block per id adds its gradient row
// into its table row, the one addition the sorted scatter makes there.
#include "train/cuda/embedding.h"

#include <cub/cub.cuh>

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) gather_kernel(const float* table, int64_t rows, int64_t dim, const int64_t* ids,
                                                          float* out) {
  const int64_t i = blockIdx.x, id = ids[i];
  float* o = out + i * dim;
  const bool valid = id >= 0 && id < rows;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads) o[k] = valid ? table[id * dim + k] : __int_as_float(0x7FC00000);
}

// keys[i] = ids[i] (or `rows` when outside [0, rows)), positions[i] = i.
__global__ void keys_kernel(const int64_t* ids, int64_t n, int64_t rows, uint64_t* keys, int32_t* positions) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  keys[i] = uint64_t(ids[i] >= 0 && ids[i] < rows ? ids[i] : rows);
  positions[i] = int32_t(i);
}

__global__ void __launch_bounds__(kThreads) scatter_kernel(const float* dout, int64_t dim, const uint64_t* keys,
                                                           const int32_t* positions, int64_t n, int64_t rows, float* dtable) {
  const int64_t first = blockIdx.x;
  const uint64_t key = keys[first];
  if (key == uint64_t(rows) || (first > 0 && keys[first - 1] == key)) return;  // skipped, or not the run's first
  float* row = dtable + int64_t(key) * dim;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads) {
    float sum = row[k];
    for (int64_t j = first; j < n && keys[j] == key; ++j) sum = __fadd_rn(sum, dout[int64_t(positions[j]) * dim + k]);
    row[k] = sum;
  }
}

__global__ void __launch_bounds__(kThreads) scatter_distinct_kernel(const float* dout, int64_t dim, const int64_t* ids,
                                                                    int64_t rows, float* dtable) {
  const int64_t i = blockIdx.x, id = ids[i];
  if (id < 0 || id >= rows) return;
  float* row = dtable + id * dim;
  for (int64_t k = threadIdx.x; k < dim; k += kThreads) row[k] = __fadd_rn(row[k], dout[i * dim + k]);
}

}  // namespace

void gather_rows_forward(const float* table, int64_t rows, int64_t dim, const int64_t* ids, int64_t n, float* out,
                         cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  gather_kernel<<<unsigned(n), kThreads, 0, stream>>>(table, rows, dim, ids, out);
  cuda::check_launch("train_cuda::gather_rows_forward");
}

void gather_rows_backward(const float* dout, int64_t dim, const int64_t* ids, int64_t n, int64_t rows, float* dtable,
                          cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  if (n > INT32_MAX) fail("train_cuda::gather_rows_backward", "at most 2^31 - 1 ids", std::to_string(n));
  int end_bit = 1;  // the bits of the largest key, `rows`
  while (end_bit < 63 && (int64_t(1) << end_bit) <= rows) ++end_bit;
  cuda::DeviceBuffer<uint64_t> keys = cuda::scratch<uint64_t>(n, stream), sorted_keys = cuda::scratch<uint64_t>(n, stream);
  cuda::DeviceBuffer<int32_t> positions = cuda::scratch<int32_t>(n, stream), sorted = cuda::scratch<int32_t>(n, stream);
  keys_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(ids, n, rows, keys.get(), positions.get());
  cuda::check_launch("train_cuda::gather_rows_backward");
  size_t bytes = 0;
  cuda::check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys.get(), sorted_keys.get(), positions.get(), sorted.get(),
                                              n, 0, end_bit, stream),
              "train_cuda::gather_rows_backward sort");
  cuda::DeviceBuffer<uint8_t> temp = cuda::scratch<uint8_t>(int64_t(bytes), stream);
  cuda::check(cub::DeviceRadixSort::SortPairs(temp.get(), bytes, keys.get(), sorted_keys.get(), positions.get(), sorted.get(),
                                              n, 0, end_bit, stream),
              "train_cuda::gather_rows_backward sort");
  scatter_kernel<<<unsigned(n), kThreads, 0, stream>>>(dout, dim, sorted_keys.get(), sorted.get(), n, rows, dtable);
  cuda::check_launch("train_cuda::gather_rows_backward");
}

void gather_rows_backward_distinct(const float* dout, int64_t dim, const int64_t* ids, int64_t n, int64_t rows, float* dtable,
                                   cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  if (n > INT32_MAX) fail("train_cuda::gather_rows_backward_distinct", "at most 2^31 - 1 ids", std::to_string(n));
  scatter_distinct_kernel<<<unsigned(n), kThreads, 0, stream>>>(dout, dim, ids, rows, dtable);
  cuda::check_launch("train_cuda::gather_rows_backward_distinct");
}

}  // namespace dsv41::train_cuda
