#pragma once
// CUDA error checking for the CUDA op set: every runtime call and every launch goes through
// check(), which turns a CUDA error into dsv41::Error naming the op.
#include <cuda_runtime_api.h>

#include <string>

#include "base/error.h"

namespace dsv41::cuda {

inline void check(cudaError_t status, const char* where) {
  if (status != cudaSuccess) fail(where, "cudaSuccess", cudaGetErrorString(status));
}

// After a launch: the launch's own error (a bad configuration), not a later asynchronous one.
inline void check_launch(const char* where) { check(cudaGetLastError(), where); }

}  // namespace dsv41::cuda
