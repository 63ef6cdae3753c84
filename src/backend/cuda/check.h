#pragma once
// CUDA error checking for the CUDA op set: every runtime call and every launch goes through
// check(), which turns a CUDA error into dsv41::Error naming the op.
#include <cuda_runtime_api.h>

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

}  // namespace dsv41::cuda
