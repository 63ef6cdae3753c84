// The uploads' page-locked ring (src/train/cuda/pinned_uploads.h): copies of 8 bytes to 20 MiB
// (past a chunk's 16 MiB) queued behind a kernel that holds the stream for a while, so that every
// chunk is still being read when the ring comes back to it, four rounds of them; the one host
// vector they come from is overwritten after each call. Every device array ends with its own
// values, and the "not ready" answers the ring asked for leave no error behind for a later launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "train/cuda/pinned_uploads.h"
#include "train_device.h"

namespace dsv41 {
namespace {

// Holds its stream for about `cycles` clock ticks.
__global__ void hold(int64_t cycles) {
  const int64_t start = clock64();
  while (clock64() - start < cycles) {
  }
}

TEST(TrainCudaPinnedUploads, EveryCopyLandsWhileTheRingIsInFlight) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<size_t> counts = {1, 1000, 700000, 3, 2621440, 12345};  // int64 values: up to 20 MiB
  const int rounds = 4;
  std::vector<std::unique_ptr<test::DeviceArray<int64_t>>> arrays;
  for (int round = 0; round < rounds; ++round)
    for (size_t n : counts) arrays.push_back(std::make_unique<test::DeviceArray<int64_t>>(n));
  train_cuda::PinnedUploads uploads;
  hold<<<1, 1>>>(int64_t(1) << 30);  // about half a second: every copy below is queued behind it
  cuda::check_launch("hold");
  std::vector<int64_t> host;
  int64_t first = 0;
  for (const auto& a : arrays) {
    const size_t n = a->bytes() / sizeof(int64_t);
    host.resize(n);
    std::iota(host.begin(), host.end(), first);
    uploads.copy(a->get(), host);
    std::fill(host.begin(), host.end(), -1);  // the caller's bytes are its own again at once
    first += int64_t(n);
  }
  hold<<<1, 1>>>(1);
  cuda::check_launch("a launch after the ring's queries");
  first = 0;
  for (const auto& a : arrays) {
    const std::vector<int64_t> got = a->download();
    std::vector<int64_t> want(got.size());
    std::iota(want.begin(), want.end(), first);
    ASSERT_EQ(got, want) << "the copy of " << got.size() << " values from " << first;
    first += int64_t(got.size());
  }
}

}  // namespace
}  // namespace dsv41
