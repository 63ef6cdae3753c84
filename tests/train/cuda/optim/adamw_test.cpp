// AdamW on the device (train_cuda/optim/adamw.h) against src/train/optim/adamw.h: bit for bit.
//
// Why the same bits: each element's update is the same fp32 operations in the same order on both
// (the kernel builds with --fmad=false, like the CPU's -ffp-contract=off; sqrtf and the division
// are IEEE round-to-nearest on the device by default, as on the CPU), and the per-step scalars
// (the bias corrections, the decay) are computed on the host the CPU's way. Nothing is summed, so
// there is no order to differ in. Six steps (t = 1 … 6, the bias corrections change at each) at
// rates changing per step, gradients over six decades with exact zeros among them (ε = 1e-20
// makes 0 / ε the update there), with and without decay; sizes 1, 7, 4096 and 100003 (a partial
// last block of threads).
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "optim_device.h"
#include "train/cuda/optim/adamw.h"
#include "train/optim/adamw.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(CudaOptimAdamW, TheCpuBitsOverSixSteps) {
  DSV41_REQUIRE_DEVICE();
  for (int64_t n : {1, 7, 4096, 100003})
    for (float decay : {0.1f, 0.0f}) {
      optim::AdamWOptions o;
      o.weight_decay = decay;
      std::vector<float> w = test::normal(size_t(n), 1.0, uint32_t(n)), m(size_t(n), 0.0f), v(size_t(n), 0.0f);
      DeviceArray<float> dw(w), dm(m), dv(v), dg{size_t(n)};
      for (int64_t step = 1; step <= 6; ++step) {
        std::vector<float> g = test::normal(size_t(n), std::pow(10.0, double(step) - 4), uint32_t(100 * n + step));
        for (size_t k = 0; k < g.size(); k += 5) g[k] = 0;
        const float lr = 0.01f * float(step);
        optim::adamw_step(w.data(), g.data(), m.data(), v.data(), n, step, lr, o);
        dg.upload(g);
        train_cuda::optim::adamw_step(dw.get(), dg.get(), dm.get(), dv.get(), n, step, lr, o);
        const std::string at = "n " + std::to_string(n) + ", decay " + std::to_string(decay) + ", step " + std::to_string(step);
        ASSERT_TRUE(test::same_bits(dw.download(), w)) << "w, " << at;
        ASSERT_TRUE(test::same_bits(dm.download(), m)) << "m, " << at;
        ASSERT_TRUE(test::same_bits(dv.download(), v)) << "v, " << at;
      }
    }
}

TEST(CudaOptimAdamW, RefusesAStepCountBelowOne) {
  DSV41_REQUIRE_DEVICE();
  DeviceArray<float> x(4);
  EXPECT_THROW(train_cuda::optim::adamw_step(x.get(), x.get(), x.get(), x.get(), 4, 0, 0.1f, optim::AdamWOptions{}), Error);
}

}  // namespace
}  // namespace dsv41
