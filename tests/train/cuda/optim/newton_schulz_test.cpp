// Newton–Schulz on the device (train_cuda/optim/newton_schulz.h: cuBLASLt products, head-wise
// blocks as one batch), in fp32 and in bf16, against src/train/optim/newton_schulz.h (backend/cpu's
// gemm_f32), block by block, three seeds per case.
//
// Cases: square, wide and tall Gaussian matrices (64², 32 × 64, 96 × 40, 37 × 17, 17 × 37, 384 ×
// 1024), tiny ones (1 × 7, 7 × 1, 1 × 1), batches of head blocks (4 wide blocks of 16 × 24, 8 tall
// ones of 16 × 8, 4 of 128 × 320 as the indexer's query heads, 8 of 128 × 256 as wo_a's groups),
// columns spread over three decades (an ill-conditioned Ĝ), and rank-one matrices (one token's
// gradient).
//
// Tolerances, fp32. Both sides run the same iteration in fp32; they differ in the order of the
// products' sums (cuBLAS's against gemm_f32's 16 lanes) and in where the linear combinations round
// (once in cuBLASLt's epilogue, twice on the CPU). The iteration carries a perturbation of X along:
// it maps each singular value through quintics of slope at most 3.45 on [0, 1.2], so a rounding
// error made at an iteration grows no faster than the singular value it sits on, and relative
// errors stay of the order of the products' rounding. Measured on the CPU (these shapes, seeds
// 1–3), against an fp32 iteration with plain sequential sums and the epilogue's single rounding —
// a worse order than either side's — the NMSE of the output is at most 5.1e-12 (384 × 1024; the
// others below 1.8e-12); on the H200 the device's is at most 1.75e-12. Bound 1e-10 for every
// full-rank case: 20 times the emulation's worst, and below what a wrong transpose, block or TF32
// products (u = 2⁻¹¹ instead of 2⁻²⁴: about 10⁷ times the NMSE) give, or one coefficient off by
// 1e-4 (measured 2e-8).
// Rank-deficient Ĝ: the zero singular values are not preserved in floating point. Rounding puts
// noise of order u into the null directions, and the quintics grow it by up to 3.4445⁸ · 2² ≈ 8e4
// (their slopes at 0) into spurious singular values of order 1e-3, which the two sides draw
// independently: measured NMSE 4.5e-5 between the two fp32 orders (1.5e-5 of the CPU's against
// double). Bound 1e-3 for the rank-one cases: still far below the O(1) of a wrong result.
//
// Tolerances, bf16. Each product's operands are rounded to bf16 (u = 2⁻⁸: a relative error of
// variance u²/3 each), every iteration; the iterate and its combinations stay fp32. A perturbation
// of relative size ~u per iteration in the singular vectors is not undone by the last quintics
// (they pull the singular values to 1, not the vectors back), so the output errs by a few u in
// RMS: NMSE of order u² ≈ 1.5e-5 times a few iterations' worth. Measured on the CPU with the same
// roundings (operands of X Xᵀ, A Aᵀ and B X cast to bf16, fp32 sums, the epilogue's combinations):
// NMSE 8e-5 to 1.24e-4 on the full-rank cases, 2.7e-4 on 7 × 1, 2.4e-5 on 1 × 1; 7e-3 to 1.1e-2
// on the rank-one ones (their spurious singular values grow from u instead of 2⁻²⁴). Bounds 1e-3
// (full rank) and 0.1 (rank one), and from below 1e-8: the products really ran on bf16 operands.
// Every case runs twice on the device: the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "optim_device.h"
#include "train/cuda/optim/newton_schulz.h"
#include "train/optim/newton_schulz.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

enum class Kind { Gaussian, RankOne, Decades };

struct Case {
  int64_t blocks, rows, cols;  // rows × cols: one block
  Kind kind;
};
constexpr Case kCases[] = {
    {1, 64, 64, Kind::Gaussian},    {1, 32, 64, Kind::Gaussian},  {1, 96, 40, Kind::Gaussian},  {1, 37, 17, Kind::Gaussian},
    {1, 17, 37, Kind::Gaussian},    {1, 384, 1024, Kind::Gaussian}, {1, 1, 7, Kind::Gaussian},  {1, 7, 1, Kind::Gaussian},
    {1, 1, 1, Kind::Gaussian},      {4, 16, 24, Kind::Gaussian},  {8, 16, 8, Kind::Gaussian},   {4, 128, 320, Kind::Gaussian},
    {8, 128, 256, Kind::Gaussian},  {1, 64, 64, Kind::Decades},   {1, 40, 96, Kind::Decades},   {1, 32, 64, Kind::RankOne},
    {1, 96, 40, Kind::RankOne},
};
struct Bounds {
  train_cuda::optim::NsPrecision precision;
  double full_rank, rank_one, below;
};
constexpr Bounds kBounds[] = {{train_cuda::optim::NsPrecision::Fp32, 1e-10, 1e-3, 0.0},
                              {train_cuda::optim::NsPrecision::Bf16, 1e-3, 0.1, 1e-8}};

std::vector<float> matrix(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0, 1);
  std::vector<float> U(size_t(c.blocks * c.rows * c.cols));
  for (int64_t b = 0; b < c.blocks; ++b) {
    float* block = U.data() + b * c.rows * c.cols;
    std::vector<double> u(size_t(c.rows)), v(size_t(c.cols));
    for (double& x : u) x = normal(rng);
    for (double& x : v) x = normal(rng);
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t j = 0; j < c.cols; ++j) {
        double x = c.kind == Kind::RankOne ? u[size_t(i)] * v[size_t(j)] : normal(rng);
        if (c.kind == Kind::Decades) x *= std::pow(10.0, -3.0 * double(j) / double(c.cols));
        block[i * c.cols + j] = float(x);
      }
  }
  return U;
}

TEST(CudaOptimNewtonSchulz, MatchesTheCpuWithinTheRoundingOfTheProducts) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  for (const Case& c : kCases)
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const std::vector<float> U = matrix(c, seed * 7919 + uint32_t(c.rows));
      std::vector<float> want(U.size());
      const int64_t block = c.rows * c.cols;
      for (int64_t b = 0; b < c.blocks; ++b) optim::orthogonalize(U.data() + b * block, c.rows, c.cols, want.data() + b * block);
      for (const Bounds& bounds : kBounds) {
        const bool bf16 = bounds.precision == train_cuda::optim::NsPrecision::Bf16;
        const std::string at = std::string(bf16 ? "bf16 " : "fp32 ") + std::to_string(c.blocks) + " × " +
                                std::to_string(c.rows) + " × " + std::to_string(c.cols) + ", kind " +
                                std::to_string(int(c.kind)) + ", seed " + std::to_string(seed);
        DeviceArray<float> X(U);
        train_cuda::optim::orthogonalize(blas, X.get(), c.blocks, c.rows, c.cols, bounds.precision);
        const std::vector<float> got = X.download();
        X.upload(U);
        train_cuda::optim::orthogonalize(blas, X.get(), c.blocks, c.rows, c.cols, bounds.precision);
        const double e = test::nmse(got, want);
        std::printf("newton-schulz %s: NMSE %.3g\n", at.c_str(), e);
        EXPECT_LE(e, c.kind == Kind::RankOne ? bounds.rank_one : bounds.full_rank) << at;
        EXPECT_GE(e, bounds.below) << at;
        EXPECT_TRUE(test::same_bits(X.download(), got)) << "two runs differ, " << at;
      }
    }
}

// A zero matrix stays zero (‖U‖ + ε keeps the division finite), as on the CPU.
TEST(CudaOptimNewtonSchulz, ZeroStaysZero) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  DeviceArray<float> X(std::vector<float>(2 * 12 * 5, 0.0f));
  for (const Bounds& bounds : kBounds) {
    train_cuda::optim::orthogonalize(blas, X.get(), 2, 12, 5, bounds.precision);
    EXPECT_TRUE(test::same_bits(X.download(), std::vector<float>(2 * 12 * 5, 0.0f)));
  }
}

}  // namespace
}  // namespace dsv41
