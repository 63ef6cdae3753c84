#pragma once
// Owned device memory for the device forward: long-lived buffers (weights, KV) from cudaMalloc,
// and stream-ordered scratch (cudaMallocAsync from the pool that keep_scratch_pool() keeps), so a
// forward call's temporaries cost no driver round trip after the first call.
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"

namespace dsv41::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // `stream` set: stream-ordered scratch, freed on that stream; else a plain allocation.
  explicit DeviceBuffer(int64_t count, cudaStream_t stream = nullptr, bool scratch = false)
      : count_(count), stream_(stream), scratch_(scratch) {
    if (count <= 0) return;
    const size_t bytes = size_t(count) * sizeof(T);
    if (scratch) {
      keep_scratch_pool();
      check(cudaMallocAsync(reinterpret_cast<void**>(&data_), bytes, stream), "device scratch");
    } else {
      check(cudaMalloc(reinterpret_cast<void**>(&data_), bytes), "device buffer");
    }
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer(std::move(o)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (!data_) return;
    if (scratch_) cudaFreeAsync(data_, stream_);
    else cudaFree(data_);
  }

  T* get() const { return data_; }
  int64_t size() const { return count_; }
  int64_t bytes() const { return count_ * int64_t(sizeof(T)); }

  void upload(const T* host, int64_t count, int64_t offset = 0, cudaStream_t stream = nullptr) {
    if (count > 0)
      check(cudaMemcpyAsync(data_ + offset, host, size_t(count) * sizeof(T), cudaMemcpyHostToDevice, stream), "upload");
  }
  void upload(const std::vector<T>& host, cudaStream_t stream = nullptr) { upload(host.data(), int64_t(host.size()), 0, stream); }
  std::vector<T> download(cudaStream_t stream = nullptr, int64_t count = -1, int64_t offset = 0) const {
    std::vector<T> out(size_t(count < 0 ? count_ - offset : count));
    if (!out.empty()) {
      check(cudaMemcpyAsync(out.data(), data_ + offset, out.size() * sizeof(T), cudaMemcpyDeviceToHost, stream), "download");
      check(cudaStreamSynchronize(stream), "download");
    }
    return out;
  }

 private:
  void swap(DeviceBuffer& o) noexcept {
    std::swap(data_, o.data_), std::swap(count_, o.count_), std::swap(stream_, o.stream_), std::swap(scratch_, o.scratch_);
  }
  T* data_ = nullptr;
  int64_t count_ = 0;
  cudaStream_t stream_ = nullptr;
  bool scratch_ = false;
};

// Page-locked host memory that grows: the staging of the host-to-device copies that move many
// pieces at once (a restore). A copy from pageable memory goes through the driver's own staging
// buffer, a second pass over the bytes at a fraction of the link's rate.
class PinnedStaging {
 public:
  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging() {
    if (data_) cudaFreeHost(data_);
  }
  // At least `bytes` of it; the earlier contents are not kept.
  uint8_t* reserve(size_t bytes) {
    if (bytes <= size_) return data_;
    if (data_) cudaFreeHost(data_);
    data_ = nullptr, size_ = 0;
    const size_t grown = bytes + bytes / 4;  // room for a somewhat larger next one
    check(cudaHostAlloc(reinterpret_cast<void**>(&data_), grown, cudaHostAllocDefault), "pinned staging");
    size_ = grown;
    return data_;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Long-lived memory from the stream-ordered pool (allocated and freed on the legacy default stream,
// which orders it after and before every blocking stream's work): for buffers made and dropped
// while serving (a sequence's KV), where cudaMalloc and cudaFree would each stall the device.
template <class T>
DeviceBuffer<T> pooled(int64_t count) {
  return DeviceBuffer<T>(count, nullptr, true);
}

// Scratch for one forward call on `stream`.
template <class T>
DeviceBuffer<T> scratch(int64_t count, cudaStream_t stream) {
  return DeviceBuffer<T>(count, stream, true);
}

// A host vector on the device as scratch.
template <class T>
DeviceBuffer<T> scratch_from(const std::vector<T>& host, cudaStream_t stream) {
  DeviceBuffer<T> d = scratch<T>(int64_t(host.size()), stream);
  d.upload(host, stream);
  return d;
}

}  // namespace dsv41::cuda
