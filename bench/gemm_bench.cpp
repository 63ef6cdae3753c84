// The CPU's fp32 GEMM (backend/cpu/gemm.h: one summation order on every CPU) against OpenBLAS's
// cblas_sgemm, the peer it replaced, on the forward's fp32 products at V4.1-Flash's shapes
// (y[M, N] = x[M, K] · wᵀ, w row-major [N, K]) for decode (M = 1), a small batch and a prefill
// chunk. Counters: GFLOP/s (2·M·N·K per call) and, for each path of ours, the ISA it ran.
// The hardware limit to compare with: cores × FMA lanes per cycle × 2 × clock (docs/benchmarks.md).
#include <benchmark/benchmark.h>

#if defined(DSV41_HAVE_BLAS)
#include <cblas.h>
#endif

#include <random>
#include <vector>

#include "backend/cpu/gemm.h"

namespace {

using namespace dsv41;

struct Operands {
  std::vector<float> x, w, y;
  Operands(int64_t M, int64_t N, int64_t K) : x(size_t(M * K)), w(size_t(N * K)), y(size_t(M * N)) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d;
    for (float& v : x) v = d(rng);
    for (float& v : w) v = d(rng);
  }
};

void flops(benchmark::State& state, int64_t M, int64_t N, int64_t K) {
  state.counters["GFLOP/s"] = benchmark::Counter(double(state.iterations()) * 2.0 * double(M * N * K) * 1e-9,
                                                 benchmark::Counter::kIsRate);
}

void BM_Ours(benchmark::State& state, GemmIsa isa) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  if (!cpu_has(isa)) return state.SkipWithError("this CPU lacks the instruction set");
  const GemmIsa before = gemm_isa();
  set_gemm_isa(isa);
  Operands o(M, N, K);
  for (auto _ : state) {
    gemm_f32(o.x.data(), M, o.w.data(), N, K, o.y.data(), N);
    benchmark::DoNotOptimize(o.y.data());
  }
  set_gemm_isa(before);
  flops(state, M, N, K);
}

#if defined(DSV41_HAVE_BLAS)
void BM_OpenBlas(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  Operands o(M, N, K);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(M), int(N), int(K), 1.0f, o.x.data(), int(K), o.w.data(),
                int(K), 0.0f, o.y.data(), int(N));
    benchmark::DoNotOptimize(o.y.data());
  }
  flops(state, M, N, K);
}
#endif

// (N, K) of V4.1-Flash's fp32 products: a bf16 dense projection (wq_b's 1024 -> 4096 slice and a
// square 4096), the ratio-4 compressor's wkv, the MoE gate, mHC's hc_fn, and one 1 MB slab of the
// LM head as linear_f32 feeds it (64 rows of 4096).
void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t M : {1, 16, 256})
    for (auto [N, K] : std::vector<std::pair<int64_t, int64_t>>{{4096, 1024}, {4096, 4096}, {1024, 4096}, {256, 4096},
                                                                  {24, 16384}, {64, 4096}})
      b->Args({M, N, K});
  b->ArgNames({"M", "N", "K"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Ours, avx512, GemmIsa::Avx512)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Ours, avx2, GemmIsa::Avx2)->Apply(shapes);
#if defined(DSV41_HAVE_BLAS)
BENCHMARK(BM_OpenBlas)->Apply(shapes);
#endif

}  // namespace
