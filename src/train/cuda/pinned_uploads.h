#pragma once
// The CUDA trainer's host-to-device copies staged through page-locked memory. A copy from pageable
// memory first waits for its stream (the driver stages it through a buffer of its own), so the host
// stops at every upload until the device has caught up; a copy from page-locked memory is queued
// and the call returns at once, and the host runs ahead of the device until it next waits for a
// result (a download).
//
// The staging memory is a ring of page-locked chunks reused across steps: each copy's bytes are
// appended to the current chunk; when one is full, an event recorded on the stream after its last
// copy marks it, and the next chunk in the ring is taken if that event has completed (its copies
// have landed) or else a new chunk is put in the ring before it. So no chunk is written while a
// copy from it may be in flight, and the ring grows to the bytes in flight at once and no further.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dsv41::train_cuda {

class PinnedUploads {
 public:
  // The copies are queued on `stream` (all of them: a chunk's event marks its copies in one stream's order).
  explicit PinnedUploads(cudaStream_t stream = nullptr) : stream_(stream) {}
  // Waits for the stream (the copies in flight read the chunks), then frees the chunks.
  ~PinnedUploads();
  PinnedUploads(const PinnedUploads&) = delete;
  PinnedUploads& operator=(const PinnedUploads&) = delete;

  // device [bytes] ← host [bytes], in the stream's order. The host bytes are copied into the ring
  // before the call returns: the caller may change or free them at once.
  void copy(void* device, const void* host, size_t bytes);

  template <class T>
  void copy(T* device, const std::vector<T>& host) {
    copy(static_cast<void*>(device), host.data(), host.size() * sizeof(T));
  }

  cudaStream_t stream() const { return stream_; }

 private:
  struct Chunk {
    uint8_t* data = nullptr;
    size_t size = 0;
    cudaEvent_t copied = nullptr;  // recorded after the chunk's last copy (never recorded: none queued)
  };
  // The ring's next chunk, for a copy of `bytes`, as the current one with nothing used.
  void next_chunk(size_t bytes);
  static Chunk allocate(size_t bytes);

  cudaStream_t stream_;
  std::vector<Chunk> ring_;  // in the order they are used
  size_t current_ = 0;       // ring_[current_] takes the copies, from byte `used_` on
  size_t used_ = 0;
};

}  // namespace dsv41::train_cuda
