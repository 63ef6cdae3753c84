// Muon on the device (train_cuda/optim/muon.h) against src/train/optim/muon.h: four steps from
// random weights with weight decay, fresh Gaussian gradients per step (of scales 1e-3 to 1), on a
// head-wise wide matrix (4 heads of 16 × 24), a head-wise tall one (8 blocks of 16 × 8), the
// indexer's query heads at a scaled size (4 of 128 × 320), whole wide, tall and odd matrices, and
// tiny ones (1 × 7, 7 × 1, 1 × 1).
//
// Tolerances:
//  * The momentum: the same bits at every step (the Nesterov step is element by element and the
//    gradients are the same; nesterov.cuh's operations are the CPU's).
//  * The weights: their movement W₄ − W₀ against the CPU's, as an NMSE. The updates differ only
//    through Newton–Schulz, NMSE ≤ 1e-10 of each step's O (newton_schulz_test.cpp argues it, for
//    the full-rank gradients here); at lr 0.02 each step moves W by about 0.0036 RMS (γη) plus the
//    decay's 0.002 · W, and four steps by more than one, so four steps' errors, added in the worst
//    case, stay below 16 · 1e-10 of the movement. The weights' own rounding (half a unit of 2⁻²³ of
//    |W| ~ 1 per step, where the two sides' values differ) adds at most 4 · (6e-8)² / 0.0036² ≈
//    1e-9. Bound 3e-9 (measured on the H200: 3.5e-12 at most). A Newton–Schulz coefficient off by
//    1e-4 gives 1.7e-8; a wrong scale (√rows for √max), block, sign or decay 1e-2 or more.
// Two runs on the device give the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "optim_device.h"
#include "train/cuda/optim/muon.h"
#include "train/optim/muon.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Shape {
  int64_t rows, cols, row_blocks;
};
constexpr Shape kShapes[] = {{64, 24, 4}, {128, 8, 8}, {512, 320, 4}, {96, 40, 1}, {40, 96, 1},
                             {37, 17, 1}, {1, 7, 1},   {7, 1, 1},     {1, 1, 1}};
constexpr int kSteps = 4;
constexpr float kLr = 0.02f;
constexpr double kBound = 3e-9;

struct DeviceRun {
  std::vector<float> W, momentum;
};

DeviceRun on_device(train_cuda::Blas& blas, const Shape& s, const std::vector<float>& W0,
              const std::vector<std::vector<float>>& grads, const std::vector<std::vector<float>>& cpu_momenta) {
  const size_t n = W0.size();
  DeviceArray<float> W(W0), m(std::vector<float>(n, 0.0f)), g(n);
  for (int t = 0; t < kSteps; ++t) {
    g.upload(grads[size_t(t)]);
    train_cuda::optim::muon_step(blas, W.get(), g.get(), m.get(), s.rows, s.cols, s.row_blocks, kLr, optim::MuonOptions{});
    EXPECT_TRUE(test::same_bits(m.download(), cpu_momenta[size_t(t)])) << "momentum after step " << t;
  }
  return {W.download(), m.download()};
}

TEST(CudaOptimMuon, FourStepsMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  for (const Shape& s : kShapes) {
    const size_t n = size_t(s.rows * s.cols);
    const uint32_t seed = uint32_t(s.rows * 1000 + s.cols);
    const std::vector<float> W0 = test::normal(n, 1.0, seed);
    std::vector<std::vector<float>> grads, momenta;
    std::vector<float> W = W0, m(n, 0.0f);
    for (int t = 0; t < kSteps; ++t) {
      grads.push_back(test::normal(n, std::pow(10.0, -t), seed + 1 + uint32_t(t)));
      optim::muon_step(W.data(), grads.back().data(), m.data(), s.rows, s.cols, s.row_blocks, kLr, optim::MuonOptions{});
      momenta.push_back(m);
    }
    const std::string at = std::to_string(s.rows) + " × " + std::to_string(s.cols) + " in " + std::to_string(s.row_blocks);
    SCOPED_TRACE(at);
    const DeviceRun a = on_device(blas, s, W0, grads, momenta);
    const double e = test::movement_nmse(a.W, W, W0);
    std::printf("muon %s: movement NMSE %.3g\n", at.c_str(), e);
    EXPECT_LE(e, kBound);
    const DeviceRun b = on_device(blas, s, W0, grads, momenta);
    EXPECT_TRUE(test::same_bits(a.W, b.W)) << "two runs differ";
  }
}

TEST(CudaOptimMuon, RefusesBlocksThatDoNotDivideTheRows) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  DeviceArray<float> x(12);
  EXPECT_THROW(train_cuda::optim::muon_step(blas, x.get(), x.get(), x.get(), 6, 2, 4, 0.1f, optim::MuonOptions{}), Error);
}

}  // namespace
}  // namespace dsv41
