// train_cuda's compressor pooling, forward and backward, against src/train/grad/compressor.h in
// float: ratios 4 and 128 over 512 channels (CSA and HCA groups), odd ratios and channel counts,
// an open group at the end (no latent, no gradient), and scores up to 80 (where exp without the
// maximum subtracted would overflow in a sum of 128).
//
// Tolerance: the same operations in the same order; only expf's last bits differ (CUDA's within 2
// units of 2⁻²⁴, the C library's within 1), so each weight is within a few units of 2⁻²⁴ relative
// and every output within ~10 (NMSE ≤ 4e-13); dscore's kv − out is then off by that relative of
// |out|, at most comparable. Bound NMSE 1e-11 on out, dkv and dscore (which start from non-zero
// values: the backward adds); a wrong term is ≥ 1e-6. Two runs: the same bits.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "train/cuda/compressor.h"
#include "train/grad/compressor.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaCompressor, PoolingMatchesTheCpu) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, d;
    int ratio;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{64, 512, 4}, Case{259, 512, 128}, Case{9, 7, 2}, Case{10, 33, 3}, Case{5, 3, 1}}) {
    const size_t n = size_t(c.rows * c.d), nout = size_t(c.rows / c.ratio * c.d);
    const std::vector<float> kv = test::normal(n, 1.0, seed++);
    std::vector<float> score = test::normal(n, 2.0, seed++);
    score[0] = 80.0f;
    const std::vector<float> dout = test::normal(nout, 1.0, seed++);
    const std::vector<float> dkv0 = test::normal(n, 0.1, seed++), dscore0 = test::normal(n, 0.1, seed++);

    std::vector<float> out(nout), dkv = dkv0, dscore = dscore0;
    grad::compressor_pool_forward<float>(kv.data(), score.data(), c.rows, c.d, c.ratio, out.data());
    grad::compressor_pool_backward<float>(kv.data(), score.data(), c.rows, c.d, c.ratio, out.data(), dout.data(), dkv.data(),
                                          dscore.data());

    DeviceArray<float> dkv_in(kv), dscore_in(score), ddout(dout);
    auto run = [&](std::vector<float>& o, std::vector<float>& gk, std::vector<float>& gs) {
      DeviceArray<float> out_d(nout), gkv(dkv0), gscore(dscore0);
      out_d.poison();
      train_cuda::compressor_pool_forward(dkv_in.get(), dscore_in.get(), c.rows, c.d, c.ratio, out_d.get());
      train_cuda::compressor_pool_backward(dkv_in.get(), dscore_in.get(), c.rows, c.d, c.ratio, out_d.get(), ddout.get(),
                                           gkv.get(), gscore.get());
      o = out_d.download(), gk = gkv.download(), gs = gscore.download();
    };
    std::vector<float> o, gk, gs;
    run(o, gk, gs);
    const double eo = test::nmse(o, out), ek = test::nmse(gk, dkv), es = test::nmse(gs, dscore);
    std::printf("compressor pool %ld rows x %ld, ratio %d: NMSE out %.3g dkv %.3g dscore %.3g\n", long(c.rows), long(c.d), c.ratio,
                eo, ek, es);
    EXPECT_LT(eo, 1e-11);
    EXPECT_LT(ek, 1e-11);
    EXPECT_LT(es, 1e-11);
    std::vector<float> o2, gk2, gs2;
    run(o2, gk2, gs2);
    EXPECT_TRUE(test::same_bits(o, o2) && test::same_bits(gk, gk2) && test::same_bits(gs, gs2)) << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
