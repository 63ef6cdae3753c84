#pragma once
// CUDA error checking for the CUDA op set: every runtime call and every launch goes through
// check(), which turns a CUDA error into dsv41::Error naming the op.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"

namespace dsv41::cuda {

inline void check(cudaError_t status, const char* where) {
  if (status != cudaSuccess) fail(where, "cudaSuccess", cudaGetErrorString(status));
}

// Stream-ordered scratch (cudaMallocAsync) from the device's default pool, which by default hands
// its memory back to the driver at every synchronization, so the next allocation maps it again
// (tens of microseconds). Keeping it in the pool makes scratch allocation free after the first
// call; set once per process, before the first scratch allocation.
inline void keep_scratch_pool() {
  static const bool once = [] {
    int device = 0;
    cudaMemPool_t pool;
    check(cudaGetDevice(&device), "cuda scratch pool");
    check(cudaDeviceGetDefaultMemPool(&pool, device), "cuda scratch pool");
    uint64_t keep = ~uint64_t(0);
    check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cuda scratch pool");
    return true;
  }();
  (void)once;
}

// After a launch: the launch's own error (a bad configuration), not a later asynchronous one.
inline void check_launch(const char* where) { check(cudaGetLastError(), where); }

// The current device's SM count, for grids sized to what the GPU runs at once.
inline int multiprocessors(const char* where) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), where);
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), where);
  return sms;
}

// How many blocks of `kernel` (threads each, smem bytes of dynamic shared memory) the whole GPU
// holds at once: the grid of a kernel whose blocks loop over their work.
template <typename Kernel>
int resident_blocks(Kernel kernel, int threads, size_t smem, const char* where) {
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, reinterpret_cast<const void*>(kernel), threads, smem), where);
  return std::max(per_sm, 1) * multiprocessors(where);
}

}  // namespace dsv41::cuda
