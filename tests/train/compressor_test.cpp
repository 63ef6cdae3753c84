// src/train/grad/compressor.h: the gated pooling's backward against central differences, with the
// projections and the norm around it (the compressor of a ratio-2 and a ratio-4 layer: x through
// wkv and wgate, pooled, RMSNorm'd), an open group at the end that gets no gradient, and the
// forward against the CPU op (backend/cpu/compressor.h pool_group).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/compressor.h"
#include "gradcheck.h"
#include "train/grad/compressor.h"
#include "train/grad/linear.h"
#include "train/grad/rms_norm.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

void check_compressor(int ratio, int64_t rows, uint32_t seed) {
  const int64_t dim = 5, hd = 4, groups = rows / ratio;
  std::vector<double> x = normal_values(size_t(rows * dim), 1.0, seed), wkv = normal_values(size_t(hd * dim), 0.5, seed + 1),
                      wgate = normal_values(size_t(hd * dim), 0.8, seed + 2), norm = normal_values(size_t(hd), 1.0, seed + 3);
  const std::vector<double> c = normal_values(size_t(groups * hd), 1.0, seed + 4);
  std::vector<double> kv(size_t(rows * hd)), score(kv.size()), pooled(size_t(groups * hd)), latent(pooled.size());
  grad::RmsNormSaved<double> norm_saved;
  auto loss = [&] {
    grad::linear_forward(x.data(), rows, dim, wkv.data(), hd, kv.data());
    grad::linear_forward(x.data(), rows, dim, wgate.data(), hd, score.data());
    grad::compressor_pool_forward(kv.data(), score.data(), rows, hd, ratio, pooled.data());
    grad::rms_norm_forward(pooled.data(), groups, hd, norm.data(), 1e-20, latent.data(), norm_saved);
    return weighted_sum(c, latent);
  };
  loss();
  std::vector<double> dpooled(pooled.size(), 0.0), dnorm(norm.size(), 0.0), dkv(kv.size(), 0.0), dscore(kv.size(), 0.0);
  grad::rms_norm_backward(pooled.data(), groups, hd, norm.data(), norm_saved, c.data(), dpooled.data(), dnorm.data());
  grad::compressor_pool_backward(kv.data(), score.data(), rows, hd, ratio, pooled.data(), dpooled.data(), dkv.data(),
                                 dscore.data());
  std::vector<double> dx(x.size(), 0.0), dwkv(wkv.size(), 0.0), dwgate(wgate.size(), 0.0);
  grad::linear_backward(x.data(), rows, dim, wkv.data(), hd, dkv.data(), dx.data(), dwkv.data());
  grad::linear_backward(x.data(), rows, dim, wgate.data(), hd, dscore.data(), dx.data(), dwgate.data());
  const std::string at = " (ratio " + std::to_string(ratio) + ")";
  expect_gradient("dx" + at, x, dx, loss);
  expect_gradient("dwkv" + at, wkv, dwkv, loss);
  expect_gradient("dwgate" + at, wgate, dwgate, loss);
  expect_gradient("dnorm" + at, norm, dnorm, loss);
  for (int64_t i = groups * ratio * dim; i < rows * dim; ++i) EXPECT_EQ(dx[size_t(i)], 0.0) << "the open group's row";
}

TEST(GradCompressor, RatioTwoMatchesCentralDifferences) { check_compressor(2, 7, 1); }
TEST(GradCompressor, RatioFourMatchesCentralDifferences) { check_compressor(4, 8, 11); }

// The CPU op in fp32: each exp is off by one unit plus the rounding of score − max (u |score − max|
// of the exponent), the sum and the accumulation by ratio units each, the division by one: the
// pooled value is within ((2 ratio + 4) u + 2 u max|score − max|) · Σ_t p_t |kv_t|.
TEST(GradCompressor, PoolForwardMatchesTheCpuOp) {
  const int ratio = 4, d = 64;
  const std::vector<float> kvf = test::bf16_normal(size_t(ratio * d), 1.0, 21), sf = test::bf16_normal(size_t(ratio * d), 3.0, 22);
  std::vector<float> out_cpu(static_cast<size_t>(d));
  pool_group(kvf.data(), sf.data(), ratio, d, out_cpu.data());
  const std::vector<double> kv(kvf.begin(), kvf.end()), s(sf.begin(), sf.end());
  std::vector<double> out(static_cast<size_t>(d));
  grad::compressor_pool_forward(kv.data(), s.data(), ratio, d, ratio, out.data());
  for (int c = 0; c < d; ++c) {
    double mx = -INFINITY, z = 0, spread = 0, mass = 0;
    for (int t = 0; t < ratio; ++t) mx = std::max(mx, s[size_t(t * d + c)]);
    for (int t = 0; t < ratio; ++t) z += std::exp(s[size_t(t * d + c)] - mx);
    for (int t = 0; t < ratio; ++t) {
      spread = std::max(spread, mx - s[size_t(t * d + c)]);
      mass += std::exp(s[size_t(t * d + c)] - mx) / z * std::fabs(kv[size_t(t * d + c)]);
    }
    EXPECT_NEAR(out_cpu[size_t(c)], out[size_t(c)], ((2 * ratio + 4) + 2 * spread) * test::kF32Unit * mass) << c;
  }
}

}  // namespace
}  // namespace dsv41
