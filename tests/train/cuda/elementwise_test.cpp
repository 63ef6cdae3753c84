// The elementwise sums (src/train/cuda/elementwise.h) against the host's arithmetic, bit for bit:
// y + x, and y + s·x with the product rounded first (the host's product kept in a volatile so that
// no fma contracts it), over values across the float range, zeros and signed zeros.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "train/cuda/elementwise.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaElementwise, SumsAreTheHostsBitForBit) {
  DSV41_REQUIRE_DEVICE();
  const size_t n = 100003;
  std::vector<float> x = test::normal(n, 1.0, 1), y = test::normal(n, 1.0, 2);
  std::mt19937 rng(3);
  for (size_t i = 0; i < n; i += 7) x[i] *= std::ldexp(1.0f, int(rng() % 200) - 100);
  x[1] = -0.0f, y[1] = 0.0f, x[2] = 0.0f;
  for (const float s : {1.0f, -0.3f, 0x1p-20f}) {
    std::vector<float> want_add(n), want_scaled(n);
    for (size_t i = 0; i < n; ++i) {
      want_add[i] = y[i] + x[i];
      volatile float product = s * x[i];
      want_scaled[i] = y[i] + product;
    }
    DeviceArray<float> dx(x), add(y), scaled(y);
    train_cuda::add_into(dx.get(), int64_t(n), add.get());
    train_cuda::add_scaled_into(dx.get(), int64_t(n), s, scaled.get());
    EXPECT_TRUE(test::same_bits(add.download(), want_add));
    EXPECT_TRUE(test::same_bits(scaled.download(), want_scaled)) << "s = " << s;
  }
  // Into zeros, the product itself.
  DeviceArray<float> dx(x), z(std::vector<float>(n, 0.0f));
  train_cuda::add_scaled_into(dx.get(), int64_t(n), 0.25f, z.get());
  std::vector<float> quarter(n);
  for (size_t i = 0; i < n; ++i) quarter[i] = 0.0f + 0.25f * x[i];
  EXPECT_TRUE(test::same_bits(z.download(), quarter));
}

}  // namespace
}  // namespace dsv41
