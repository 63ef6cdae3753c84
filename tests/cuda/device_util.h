#pragma once
// Helpers of the CUDA op tests: device copies of host vectors, the NMSE measure every op test
// states its tolerance in, and the check that a GPU is present.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cuda/check.h"

namespace dsv41::test {

inline bool have_device() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

#define DSV41_REQUIRE_DEVICE() \
  ASSERT_TRUE(::dsv41::test::have_device()) << "no CUDA device: GPU tests run only where one is present"

// A device array owning its memory.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) : n_(n) { cuda::check(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()), "test alloc"); }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() const { return p_; }
  size_t bytes() const { return n_ * sizeof(T) > 0 ? n_ * sizeof(T) : 1; }
  void upload(const std::vector<T>& host) {
    cuda::check(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "test upload");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    cuda::check(cudaDeviceSynchronize(), "test sync");
    cuda::check(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "test download");
    return host;
  }
  // Fills with NaN bytes (0xFF), so an output element the kernel never wrote fails the comparison.
  void poison() { cuda::check(cudaMemset(p_, 0xFF, bytes()), "test poison"); }

 private:
  size_t n_;
  T* p_ = nullptr;
};

// Normalized mean squared error Σ(got − want)² / Σ want², in double; +infinity when any element of
// `got` is not finite where `want` is (an unwritten or NaN output), or the sizes differ.
inline double nmse(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0, ref = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(want[i])) return INFINITY;
    const double d = double(got[i]) - double(want[i]);
    err += d * d;
    ref += double(want[i]) * want[i];
  }
  return ref > 0 ? err / ref : err;
}

}  // namespace dsv41::test
