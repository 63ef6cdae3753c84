// train_cuda's products (linear.h: cuBLASLt, bf16 operands, fp32 accumulation) and cast_bf16
// against src/train/grad/linear.h in float, on shapes of the trained models (256 rows × 4096 →
// 1024, 64 × 1024 → 4096, 130 × 264 → 200) and odd ones (one row; K and N of 17, 37, 100, 5: leading
// dimensions off cuBLASLt's 16-byte alignment); the grouped form (wo_a: 8 groups of 4096 → 1024,
// and odd ones) against grad::linear_grouped_* likewise.
//
// Tolerances:
//  * bf16-representable operands: every product x_k·w_k of two bf16 values is exact in fp32 (8 + 8
//    significant bits), so y, dx and dW differ from the CPU's only in how the fp32 sums are formed
//    (cuBLASLt's order, the tensor cores' accumulation inside an MMA). Rounding errors of a sum of K
//    random-sign terms walk: NMSE ≈ K·2⁻⁴⁸/6 ≈ 2e-12 at K = 4096, and a few times that for the tensor
//    cores' truncating accumulation. Bound 1e-7, the bound the project's own bf16 tensor-core GEMM
//    holds against the CPU (docs/gpu-tests.md: 2.3e-8 measured at K = 4096); a transposed operand or
//    a lost accumulation is NMSE ≥ 1e-2. The gradients start from non-zero values (backward adds).
//  * fp32 operands: the device casts x, W and dy to bf16 (straight through). A cast errs by δ with
//    |δ| ≤ u = 2⁻⁸ relative and E[δ²] ≤ u²/3 (the error uniform over half a bf16 unit); a product
//    of two cast values errs by δa + δb (+ δaδb), independent across terms, so a sum of
//    random-sign terms has NMSE ≈ E[(δa + δb)²] ≤ 2u²/3 ≈ 1.0e-5. Bound 2u² = 3.05e-5 (3× the
//    expectation; each output averages many terms or many outputs are averaged). Asserted from
//    below too: NMSE > 1e-7, so the products really are on bf16 values.
//  * cast_bf16 gives the host's round-to-nearest-even bits exactly.
//  * Run twice on the same inputs, every result is the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "train/cuda/linear.h"
#include "train/grad/linear.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Shape {
  int64_t M, K, N;
};
constexpr Shape kShapes[] = {{256, 4096, 1024}, {64, 1024, 4096}, {130, 264, 200}, {1, 512, 64},
                             {7, 100, 37},      {33, 17, 5},      {2, 5, 100}};

struct Results {
  std::vector<float> y, dx, dW;
};

// The device op on fp32 inputs, cast to bf16 on the device; dx and dW start at dx0 and dW0.
Results on_device(train_cuda::Blas& blas, const Shape& s, const std::vector<float>& x, const std::vector<float>& W,
                  const std::vector<float>& dy, const std::vector<float>& dx0, const std::vector<float>& dW0) {
  DeviceArray<float> x32(x), W32(W), dy32(dy), y(size_t(s.M * s.N)), dx(dx0), dW(dW0);
  DeviceArray<uint16_t> xb(x.size()), Wb(W.size()), dyb(dy.size());
  train_cuda::cast_bf16(x32.get(), int64_t(x.size()), xb.get());
  train_cuda::cast_bf16(W32.get(), int64_t(W.size()), Wb.get());
  train_cuda::cast_bf16(dy32.get(), int64_t(dy.size()), dyb.get());
  EXPECT_EQ(xb.download(), test::bf16_bits(x)) << "cast_bf16";
  EXPECT_EQ(Wb.download(), test::bf16_bits(W)) << "cast_bf16";
  y.poison();
  train_cuda::linear_forward(blas, train_cuda::Operands::Bf16, xb.get(), s.M, s.K, Wb.get(), s.N, y.get());
  train_cuda::linear_backward(blas, train_cuda::Operands::Bf16, xb.get(), s.M, s.K, Wb.get(), s.N, dyb.get(), dx.get(),
                              dW.get());
  return {y.download(), dx.download(), dW.download()};
}

Results on_cpu(const Shape& s, const std::vector<float>& x, const std::vector<float>& W, const std::vector<float>& dy,
               const std::vector<float>& dx0, const std::vector<float>& dW0) {
  Results r{std::vector<float>(size_t(s.M * s.N)), dx0, dW0};
  grad::linear_forward<float>(x.data(), s.M, s.K, W.data(), s.N, r.y.data());
  grad::linear_backward<float>(x.data(), s.M, s.K, W.data(), s.N, dy.data(), r.dx.data(), r.dW.data());
  return r;
}

void expect_same_bits(const Results& a, const Results& b, const Shape& s) {
  EXPECT_TRUE(test::same_bits(a.y, b.y)) << "y differs between runs, " << s.M << "x" << s.K << "x" << s.N;
  EXPECT_TRUE(test::same_bits(a.dx, b.dx)) << "dx differs between runs, " << s.M << "x" << s.K << "x" << s.N;
  EXPECT_TRUE(test::same_bits(a.dW, b.dW)) << "dW differs between runs, " << s.M << "x" << s.K << "x" << s.N;
}

TEST(TrainCudaLinear, Bf16OperandsMatchTheCpuUpToTheSumsOrder) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  uint32_t seed = 1;
  for (const Shape& s : kShapes) {
    const double w_scale = 1.0 / std::sqrt(double(s.K));
    const std::vector<float> x = test::rounded_bf16(test::normal(size_t(s.M * s.K), 1.0, seed++));
    const std::vector<float> W = test::rounded_bf16(test::normal(size_t(s.N * s.K), w_scale, seed++));
    const std::vector<float> dy = test::rounded_bf16(test::normal(size_t(s.M * s.N), 1.0, seed++));
    // Gradients already holding something (a tenth of the products' scale): the backward adds.
    const std::vector<float> dx0 = test::normal(x.size(), 0.1 * std::sqrt(double(s.N)) * w_scale, seed++);
    const std::vector<float> dW0 = test::normal(W.size(), 0.1 * std::sqrt(double(s.M)), seed++);
    const Results want = on_cpu(s, x, W, dy, dx0, dW0);
    const Results got = on_device(blas, s, x, W, dy, dx0, dW0);
    const double ey = test::nmse(got.y, want.y), edx = test::nmse(got.dx, want.dx), edw = test::nmse(got.dW, want.dW);
    std::printf("linear bf16 operands %ldx%ldx%ld: NMSE y %.3g dx %.3g dW %.3g\n", long(s.M), long(s.K), long(s.N), ey, edx, edw);
    EXPECT_LT(ey, 1e-7) << s.M << "x" << s.K << "x" << s.N;
    EXPECT_LT(edx, 1e-7) << s.M << "x" << s.K << "x" << s.N;
    EXPECT_LT(edw, 1e-7) << s.M << "x" << s.K << "x" << s.N;
    expect_same_bits(got, on_device(blas, s, x, W, dy, dx0, dW0), s);
  }
}

TEST(TrainCudaLinear, Fp32OperandsWithinTheCastsBound) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  const double bound = 2 * test::kBf16Unit * test::kBf16Unit;
  uint32_t seed = 100;
  for (const Shape& s : kShapes) {
    const std::vector<float> x = test::normal(size_t(s.M * s.K), 1.0, seed++);
    const std::vector<float> W = test::normal(size_t(s.N * s.K), 1.0 / std::sqrt(double(s.K)), seed++);
    const std::vector<float> dy = test::normal(size_t(s.M * s.N), 1.0, seed++);
    const std::vector<float> dx0(x.size(), 0.0f), dW0(W.size(), 0.0f);
    const Results want = on_cpu(s, x, W, dy, dx0, dW0);
    const Results got = on_device(blas, s, x, W, dy, dx0, dW0);
    const double ey = test::nmse(got.y, want.y), edx = test::nmse(got.dx, want.dx), edw = test::nmse(got.dW, want.dW);
    std::printf("linear fp32 operands %ldx%ldx%ld: NMSE y %.3g dx %.3g dW %.3g (bound %.3g)\n", long(s.M), long(s.K),
                long(s.N), ey, edx, edw, bound);
    for (const double e : {ey, edx, edw}) {
      EXPECT_LT(e, bound) << s.M << "x" << s.K << "x" << s.N;
      EXPECT_GT(e, 1e-7) << "products not on bf16 values? " << s.M << "x" << s.K << "x" << s.N;
    }
    expect_same_bits(got, on_device(blas, s, x, W, dy, dx0, dW0), s);
  }
}

// The grouped form: x [M, G, Kg], W [G·Ng, Kg], y [M, G, Ng], as one strided batch on the device.
struct GroupShape {
  int64_t M, G, Kg, Ng;
};

Results grouped_on_device(train_cuda::Blas& blas, const GroupShape& s, const std::vector<float>& x, const std::vector<float>& W,
                          const std::vector<float>& dy, const std::vector<float>& dx0, const std::vector<float>& dW0) {
  DeviceArray<float> x32(x), W32(W), dy32(dy), y(dy.size()), dx(dx0), dW(dW0);
  DeviceArray<uint16_t> xb(x.size()), Wb(W.size()), dyb(dy.size());
  train_cuda::cast_bf16(x32.get(), int64_t(x.size()), xb.get());
  train_cuda::cast_bf16(W32.get(), int64_t(W.size()), Wb.get());
  train_cuda::cast_bf16(dy32.get(), int64_t(dy.size()), dyb.get());
  y.poison();
  train_cuda::linear_grouped_forward(blas, train_cuda::Operands::Bf16, xb.get(), s.M, s.G, s.Kg, Wb.get(), s.Ng,
                                     y.get());
  train_cuda::linear_grouped_backward(blas, train_cuda::Operands::Bf16, xb.get(), s.M, s.G, s.Kg, Wb.get(), s.Ng,
                                      dyb.get(), dx.get(), dW.get());
  return {y.download(), dx.download(), dW.download()};
}

TEST(TrainCudaLinear, GroupedMatchesTheCpuWithinTheSameBounds) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  const double cast_bound = 2 * test::kBf16Unit * test::kBf16Unit;
  uint32_t seed = 200;
  for (const GroupShape s : {GroupShape{64, 8, 4096, 1024}, GroupShape{130, 2, 100, 37}, GroupShape{7, 3, 17, 5}}) {
    for (const bool bf16_operands : {true, false}) {
      const double w_scale = 1.0 / std::sqrt(double(s.Kg));
      auto operand = [&](size_t n, double stddev) {
        std::vector<float> v = test::normal(n, stddev, seed++);
        return bf16_operands ? test::rounded_bf16(v) : v;
      };
      const std::vector<float> x = operand(size_t(s.M * s.G * s.Kg), 1.0), W = operand(size_t(s.G * s.Ng * s.Kg), w_scale);
      const std::vector<float> dy = operand(size_t(s.M * s.G * s.Ng), 1.0);
      // With bf16 operands the gradients start from non-zero values (the backward adds).
      const std::vector<float> dx0 = bf16_operands ? test::normal(x.size(), 0.1 * std::sqrt(double(s.Ng)) * w_scale, seed++)
                                                   : std::vector<float>(x.size(), 0.0f);
      const std::vector<float> dW0 =
          bf16_operands ? test::normal(W.size(), 0.1 * std::sqrt(double(s.M)), seed++) : std::vector<float>(W.size(), 0.0f);
      Results want{std::vector<float>(dy.size()), dx0, dW0};
      grad::linear_grouped_forward<float>(x.data(), s.M, s.G, s.Kg, W.data(), s.Ng, want.y.data());
      grad::linear_grouped_backward<float>(x.data(), s.M, s.G, s.Kg, W.data(), s.Ng, dy.data(), want.dx.data(),
                                           want.dW.data());
      const Results got = grouped_on_device(blas, s, x, W, dy, dx0, dW0);
      const double e[3] = {test::nmse(got.y, want.y), test::nmse(got.dx, want.dx), test::nmse(got.dW, want.dW)};
      std::printf("linear grouped %s %ldx%ldx%ld→%ld: NMSE y %.3g dx %.3g dW %.3g\n", bf16_operands ? "bf16" : "fp32",
                  long(s.M), long(s.G), long(s.Kg), long(s.Ng), e[0], e[1], e[2]);
      for (const double v : e) {
        if (bf16_operands) {
          EXPECT_LT(v, 1e-7) << s.M << "x" << s.G << "x" << s.Kg << "x" << s.Ng;
        } else {
          EXPECT_LT(v, cast_bound) << s.M << "x" << s.G << "x" << s.Kg << "x" << s.Ng;
          EXPECT_GT(v, 1e-7) << "products not on bf16 values? " << s.M << "x" << s.G << "x" << s.Kg << "x" << s.Ng;
        }
      }
      expect_same_bits(got, grouped_on_device(blas, s, x, W, dy, dx0, dW0), Shape{s.M, s.G * s.Kg, s.G * s.Ng});
    }
  }
}

}  // namespace
}  // namespace dsv41
