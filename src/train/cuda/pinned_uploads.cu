// The uploads' page-locked ring (pinned_uploads.h).
#include "train/cuda/pinned_uploads.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/check.h"

namespace dsv41::train_cuda {

namespace {

// A chunk holds a few of a step's largest copies (a layer's attention lists: 4–5 MiB at the
// default's shape) and many of its small ones; a larger copy gets a chunk of its own size.
constexpr size_t kChunkBytes = size_t(16) << 20;
// Each copy starts on a cache line of its own.
constexpr size_t kAlign = 64;

constexpr const char* kWhere = "train_cuda::PinnedUploads";

}  // namespace

PinnedUploads::~PinnedUploads() {
  cudaStreamSynchronize(stream_);  // a destructor throws nothing: the chunks are freed after it either way
  for (Chunk& c : ring_) {
    cudaEventDestroy(c.copied);
    cudaFreeHost(c.data);
  }
}

void PinnedUploads::copy(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  if (ring_.empty() || used_ + bytes > ring_[current_].size) next_chunk(bytes);
  uint8_t* staged = ring_[current_].data + used_;
  std::memcpy(staged, host, bytes);
  cuda::check(cudaMemcpyAsync(device, staged, bytes, cudaMemcpyHostToDevice, stream_), kWhere);
  used_ += (bytes + kAlign - 1) / kAlign * kAlign;
}

PinnedUploads::Chunk PinnedUploads::allocate(size_t bytes) {
  Chunk c;
  c.size = std::max(kChunkBytes, bytes);
  cuda::check(cudaMallocHost(reinterpret_cast<void**>(&c.data), c.size), kWhere);
  if (const cudaError_t status = cudaEventCreateWithFlags(&c.copied, cudaEventDisableTiming); status != cudaSuccess) {
    cudaFreeHost(c.data);
    cuda::check(status, kWhere);
  }
  return c;
}

void PinnedUploads::next_chunk(size_t bytes) {
  if (!ring_.empty()) {
    cuda::check(cudaEventRecord(ring_[current_].copied, stream_), kWhere);  // after the full chunk's copies
    const size_t next = (current_ + 1) % ring_.size();                     // the oldest chunk (or this one, alone)
    const cudaError_t landed = cudaEventQuery(ring_[next].copied);
    if (landed == cudaErrorNotReady) {
      cudaGetLastError();  // "not ready" is an answer, not an error: cleared so that no later check reports it
    } else {
      cuda::check(landed, kWhere);
      if (ring_[next].size >= bytes) {
        current_ = next;
        used_ = 0;
        return;
      }
    }
  }
  // The ring's next chunk is still read by its copies (or too small): a new one goes before it.
  const size_t at = ring_.empty() ? 0 : current_ + 1;
  ring_.insert(ring_.begin() + ptrdiff_t(at), allocate(bytes));
  current_ = at;
  used_ = 0;
}

}  // namespace dsv41::train_cuda
