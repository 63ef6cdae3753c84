// The CPU's fp32 GEMM (backend/cpu/gemm.h): the summation order it documents, the same bits on
// every code path (scalar, AVX2, AVX-512: whichever this CPU has), for any M, N, tile edge,
// output stride and thread count, and the textbook error bound of that order against float64.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "base/error.h"

#include <omp.h>  // the full build, which the CPU tests need, has OpenMP

namespace dsv41 {
namespace {

// Restores the process's path at the end of a test.
struct IsaGuard {
  GemmIsa before = gemm_isa();
  ~IsaGuard() { set_gemm_isa(before); }
};

std::vector<GemmIsa> available() {
  std::vector<GemmIsa> out;
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (cpu_has(isa)) out.push_back(isa);
  return out;
}

// Values with exponents spread over 2^-20 .. 2^20, so that nearly every sum depends on its order.
std::vector<float> spread(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> m(-1, 1);
  std::uniform_int_distribution<int> e(-20, 20);
  std::vector<float> v(n);
  for (float& f : v) f = std::ldexp(m(rng), e(rng));
  return v;
}

std::vector<float> product(const std::vector<float>& x, int64_t M, const std::vector<float>& w, int64_t N, int64_t K) {
  std::vector<float> y(size_t(M * N));
  gemm_f32(x.data(), M, w.data(), N, K, y.data(), N);
  return y;
}

float single(const std::vector<float>& x, const std::vector<float>& w) {
  float y;
  gemm_f32(x.data(), 1, w.data(), 1, int64_t(x.size()), &y, 1);
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The order, pinned by sums whose value tells it: these numbers are worked out by hand from
// gemm.h's text, not taken from the code.
TEST(Gemm, SumsInTheDocumentedOrder) {
  IsaGuard guard;
  const float big = 16777216.0f;  // 2^24: big + 1 rounds back to big
  for (GemmIsa isa : available()) {
    set_gemm_isa(isa);
    // Lanes 0, 1 and 8 hold 2^24, -2^24 and 1. Lane 8 goes into lane 0 first (2^24 + 1 = 2^24),
    // then lane 1 cancels it: 0. Adding k in order would give 1.
    std::vector<float> x(9, 0.0f), ones(9, 1.0f);
    x[0] = big, x[1] = -big, x[8] = 1;
    EXPECT_EQ(single(x, ones), 0.0f) << isa_name(isa);
    // Lane 0 holds k = 0 and k = 16: 2^24, then 1 (lost), while k = 1 (-2^24) sits in lane 1: 0.
    std::vector<float> y(17, 0.0f), ones17(17, 1.0f);
    y[0] = big, y[16] = 1, y[1] = -big;
    EXPECT_EQ(single(y, ones17), 0.0f) << isa_name(isa);
    // Fused: 1 + (1 + 2^-12)·(-(1 + 2^-12)) is exactly -(2^-11 + 2^-24); a rounded product gives -2^-11.
    std::vector<float> a(17, 0.0f), b(17, 0.0f);
    a[0] = b[0] = 1;
    a[16] = 1 + std::ldexp(1.0f, -12), b[16] = -a[16];
    EXPECT_EQ(single(a, b), -(std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24))) << isa_name(isa);
  }
}

// Every path against the scalar one, bit for bit, over K tails (K mod 16 = 0..15), tile edges
// (M, N not multiples of the 4 × 4 or 2 × 2 tiles) and an output stride wider than N.
TEST(Gemm, EveryPathGivesTheScalarBits) {
  IsaGuard guard;
  for (int64_t K : {1, 7, 15, 16, 17, 31, 33, 128, 1000, 4101})
    for (auto [M, N] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 9}, {3, 5}, {5, 3}, {9, 11}, {70, 6}}) {
      const std::vector<float> x = spread(size_t(M * K), uint32_t(K)), w = spread(size_t(N * K), uint32_t(K + 1));
      set_gemm_isa(GemmIsa::Scalar);
      const std::vector<float> want = product(x, M, w, N, K);
      for (GemmIsa isa : available()) {
        set_gemm_isa(isa);
        EXPECT_TRUE(same_bits(product(x, M, w, N, K), want)) << isa_name(isa) << " M " << M << " N " << N << " K " << K;
        // Into a wider output: the same values, and the gaps between rows untouched.
        const int64_t ldy = N + 3;
        std::vector<float> wide(size_t(M * ldy), -7.0f);
        gemm_f32(x.data(), M, w.data(), N, K, wide.data(), ldy);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < ldy; ++n)
            ASSERT_EQ(wide[m * ldy + n], n < N ? want[m * N + n] : -7.0f) << isa_name(isa) << " ldy " << ldy;
      }
    }
}

// One output depends on its own row of x and of w only: a row alone, or batched with others,
// gives the same bits (what makes a chunked prefill multiply exactly like a one-shot one).
TEST(Gemm, AnOutputIsTheSameInAnyBatch) {
  const int64_t M = 37, N = 29, K = 300;
  const std::vector<float> x = spread(size_t(M * K), 1), w = spread(size_t(N * K), 2);
  const std::vector<float> all = product(x, M, w, N, K);
  for (int64_t m : {int64_t(0), int64_t(17), M - 1})
    for (int64_t n : {int64_t(0), int64_t(5), N - 1}) {
      const std::vector<float> xr(x.begin() + m * K, x.begin() + (m + 1) * K), wr(w.begin() + n * K, w.begin() + (n + 1) * K);
      float alone = single(xr, wr);
      EXPECT_EQ(std::memcmp(&alone, &all[size_t(m * N + n)], sizeof(float)), 0) << m << ", " << n;
    }
}

// Large enough to run on several threads: 1 thread or 2 give the same bits (threads split the
// outputs, never a sum).
TEST(Gemm, ThreadCountDoesNotChangeTheBits) {
  const int64_t M = 70, N = 300, K = 512;  // 10.7M multiply-adds: above the parallel threshold
  const std::vector<float> x = spread(size_t(M * K), 3), w = spread(size_t(N * K), 4);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = product(x, M, w, N, K);
  omp_set_num_threads(2);
  const std::vector<float> two = product(x, M, w, N, K);
  omp_set_num_threads(threads);
  EXPECT_TRUE(same_bits(one, two));
}

// Against float64: the order's error bound. Lane sums of ceil(K/16) fused steps, then 4 pairwise
// additions: every term passes through at most ceil(K/16) + 4 roundings, so
// |y - exact| <= (ceil(K/16) + 4) · u · Σ|x w| (u = 2^-24, to first order: the 1% covers the rest).
TEST(Gemm, WithinTheOrdersErrorBound) {
  for (int64_t K : {16, 100, 4096, 16384}) {
    const int64_t M = 3, N = 5;
    const std::vector<float> x = spread(size_t(M * K), uint32_t(10 + K)), w = spread(size_t(N * K), uint32_t(11 + K));
    const std::vector<float> y = product(x, M, w, N, K);
    const double u = std::ldexp(1.0, -24), steps = double((K + 15) / 16 + 4);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double exact = 0, magnitude = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = double(x[m * K + k]) * double(w[n * K + k]);
          exact += t;
          magnitude += std::fabs(t);
        }
        EXPECT_LE(std::fabs(double(y[m * N + n]) - exact), 1.01 * steps * u * magnitude) << "K " << K;
      }
  }
}

}  // namespace
}  // namespace dsv41
