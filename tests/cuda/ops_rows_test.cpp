// The row plumbing of backend/cuda/rows.h against the CPU's definitions. to_bf16 is a format
// change: each output must be bf16_from_float of its input exactly (the CPU's encoder, round to
// nearest even), at lengths that are and are not whole groups of the kernel's 8 values a thread,
// and at offsets that leave x or out off the 16-byte grid (the kernel's one-by-one path). Values:
// bf16-exact ones (the activations it converts) and arbitrary fp32 ones (where the rounding shows).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "backend/cuda/rows.h"
#include "device_util.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

using namespace dsv41::test;

TEST(CudaRows, ToBf16IsTheCpuEncoderAtAnyLengthAndOffset) {
  DSV41_REQUIRE_DEVICE();
  std::mt19937 rng(41);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const bool exact : {true, false})
    for (const int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(9), int64_t(4099), int64_t(1) << 20})
      for (const int x_off : {0, 1})
        for (const int out_off : {0, 3}) {
          std::vector<float> x(size_t(n + x_off));
          for (float& v : x) v = exact ? bf16_to_float(bf16_from_float(normal(rng))) : normal(rng);
          DeviceArray<float> dx(x);
          DeviceArray<uint16_t> dout(size_t(n + out_off + 8));  // 8 past the end: nothing written there
          dout.poison();
          cuda::to_bf16(dx.get() + x_off, n, dout.get() + out_off, nullptr);
          const std::vector<uint16_t> got = dout.download();
          int64_t bad = 0;
          for (int64_t i = 0; i < n; ++i) bad += got[size_t(i + out_off)] != bf16_from_float(x[size_t(i + x_off)]);
          for (int i = 0; i < out_off; ++i) bad += got[size_t(i)] != 0xFFFF;  // nothing written around out
          for (int i = 0; i < 8; ++i) bad += got[size_t(n + out_off + i)] != 0xFFFF;
          EXPECT_EQ(bad, 0) << "n " << n << ", x offset " << x_off << ", out offset " << out_off
                            << (exact ? ", bf16 values" : ", fp32 values");
        }
}

}  // namespace
}  // namespace dsv41
