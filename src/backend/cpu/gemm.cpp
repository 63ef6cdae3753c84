#include "backend/cpu/gemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace dsv41 {

namespace {

constexpr int64_t kLanes = 16;
// Below this many multiply-adds a product runs on one thread: waking the other cores costs more.
constexpr int64_t kParallelWork = int64_t(1) << 20;
// Rows of x per pass over w: 64 rows of K <= 4096 fp32 (1 MB) stay in L2 while every tile of w
// streams past them.
constexpr int64_t kRowBlock = 64;

// --- scalar: the order written out, one lane at a time --------------------------------------------
//
// Each instruction set gives a Tile<MR, NR> whose static run() computes the tile of outputs
// y[i·ldy + n], i < MR rows of x, n < NR rows of w, each sum in the order of gemm.h.

// The lanes' pairwise sum; the vector paths store their lanes and call it too.
float add_lanes(float v[kLanes]) {
  for (int half = kLanes / 2; half >= 1; half /= 2)
    for (int l = 0; l < half; ++l) v[l] += v[l + half];
  return v[0];
}

template <int MR, int NR>
struct ScalarTile {
  static void run(const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
    for (int i = 0; i < MR; ++i)
      for (int n = 0; n < NR; ++n) {
        float acc[kLanes] = {};
        for (int64_t k0 = 0; k0 < K; k0 += kLanes)
          for (int64_t l = 0; l < kLanes; ++l) {
            const int64_t k = k0 + l;
            acc[l] = std::fma(k < K ? x[i * K + k] : 0.0f, k < K ? w[n * K + k] : 0.0f, acc[l]);
          }
        y[i * ldy + n] = add_lanes(acc);
      }
  }
};

#if defined(__x86_64__)

// --- AVX-512: one 16-lane register per output; 4 × 4 outputs = 16 accumulators --------------------

#define DSV41_AVX512 __attribute__((target("avx512f"), always_inline)) static inline

template <int MR, int NR>
struct Avx512Tile {
  // One step of 16 k: every lane's next product; `mask` zero-fills the lanes past K.
  DSV41_AVX512 void step(const float* x, const float* w, int64_t K, int64_t k, __mmask16 mask, __m512 (&acc)[MR][NR]) {
    __m512 xv[MR];
    for (int i = 0; i < MR; ++i) xv[i] = _mm512_maskz_loadu_ps(mask, x + i * K + k);
    for (int n = 0; n < NR; ++n) {
      const __m512 wv = _mm512_maskz_loadu_ps(mask, w + n * K + k);
      for (int i = 0; i < MR; ++i) acc[i][n] = _mm512_fmadd_ps(xv[i], wv, acc[i][n]);
    }
  }
  __attribute__((target("avx512f"))) static void run(const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
    __m512 acc[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int n = 0; n < NR; ++n) acc[i][n] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) step(x, w, K, k, __mmask16(0xFFFF), acc);
    if (k < K) step(x, w, K, k, __mmask16((1u << (K - k)) - 1), acc);
    float lanes[kLanes];
    for (int i = 0; i < MR; ++i)
      for (int n = 0; n < NR; ++n) {
        _mm512_storeu_ps(lanes, acc[i][n]);
        y[i * ldy + n] = add_lanes(lanes);
      }
  }
};

// --- AVX2: each output's 16 lanes in two registers (lanes 0-7, 8-15); 2 × 2 outputs --------------

#define DSV41_AVX2 __attribute__((target("avx2,fma"), always_inline)) static inline

template <int MR, int NR>
struct Avx2Tile {
  // One step of 16 k; `mlo`, `mhi` zero-fill the lanes past K.
  DSV41_AVX2 void step(const float* x, const float* w, int64_t K, int64_t k, __m256i mlo, __m256i mhi, __m256 (&lo)[MR][NR],
                       __m256 (&hi)[MR][NR]) {
    __m256 xl[MR], xh[MR];
    for (int i = 0; i < MR; ++i) {
      xl[i] = _mm256_maskload_ps(x + i * K + k, mlo);
      xh[i] = _mm256_maskload_ps(x + i * K + k + 8, mhi);
    }
    for (int n = 0; n < NR; ++n) {
      const __m256 wl = _mm256_maskload_ps(w + n * K + k, mlo), wh = _mm256_maskload_ps(w + n * K + k + 8, mhi);
      for (int i = 0; i < MR; ++i) {
        lo[i][n] = _mm256_fmadd_ps(xl[i], wl, lo[i][n]);
        hi[i][n] = _mm256_fmadd_ps(xh[i], wh, hi[i][n]);
      }
    }
  }
  __attribute__((target("avx2,fma"))) static void run(const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
    __m256 lo[MR][NR], hi[MR][NR];
    for (int i = 0; i < MR; ++i)
      for (int n = 0; n < NR; ++n) lo[i][n] = hi[i][n] = _mm256_setzero_ps();
    const __m256i all = _mm256_set1_epi32(-1), iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t k = 0;
    for (; k + kLanes <= K; k += kLanes) step(x, w, K, k, all, all, lo, hi);
    if (k < K) {
      const int rest = int(K - k);  // lanes 0 .. rest-1 hold k < K
      step(x, w, K, k, _mm256_cmpgt_epi32(_mm256_set1_epi32(rest), iota),
           _mm256_cmpgt_epi32(_mm256_set1_epi32(rest - 8), iota), lo, hi);
    }
    float lanes[kLanes];
    for (int i = 0; i < MR; ++i)
      for (int n = 0; n < NR; ++n) {
        _mm256_storeu_ps(lanes, lo[i][n]);
        _mm256_storeu_ps(lanes + 8, hi[i][n]);
        y[i * ldy + n] = add_lanes(lanes);
      }
  }
};

#undef DSV41_AVX512
#undef DSV41_AVX2
#endif

// The tile of mr × nr outputs (mr <= MR, nr <= NR): edge tiles get their own instantiation, so
// that every loop over registers has a constant trip count.
template <template <int, int> class Tile, int MR, int NR>
void run_tile(int64_t mr, int64_t nr, const float* x, const float* w, int64_t K, float* y, int64_t ldy) {
  if constexpr (MR > 1)
    if (mr < MR) return run_tile<Tile, MR - 1, NR>(mr, nr, x, w, K, y, ldy);
  if constexpr (NR > 1)
    if (nr < NR) return run_tile<Tile, MR, NR - 1>(mr, nr, x, w, K, y, ldy);
  Tile<MR, NR>::run(x, w, K, y, ldy);
}

template <template <int, int> class Tile, int MR, int NR>
void gemm_with(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y, int64_t ldy) {
  const int64_t n_tiles = (N + NR - 1) / NR;
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t rows = std::min(kRowBlock, M - m0);
#pragma omp parallel for schedule(static) if (rows * N * K >= kParallelWork)
    for (int64_t t = 0; t < n_tiles; ++t) {
      const int64_t n0 = t * NR, nr = std::min<int64_t>(NR, N - n0);
      for (int64_t i = 0; i < rows; i += MR)
        run_tile<Tile, MR, NR>(std::min<int64_t>(MR, rows - i), nr, x + (m0 + i) * K, w + n0 * K, K, y + (m0 + i) * ldy + n0,
                               ldy);
    }
  }
}

GemmIsa widest() {
  for (GemmIsa isa : {GemmIsa::Avx512, GemmIsa::Avx2})
    if (cpu_has(isa)) return isa;
  return GemmIsa::Scalar;
}

GemmIsa from_environment() {
  const char* env = std::getenv("DSV41_CPU_ISA");
  if (!env || !*env) return widest();
  for (GemmIsa isa : {GemmIsa::Scalar, GemmIsa::Avx2, GemmIsa::Avx512})
    if (std::string(env) == isa_name(isa)) {
      if (!cpu_has(isa)) fail("DSV41_CPU_ISA", "an instruction set this CPU has", env);
      return isa;
    }
  fail("DSV41_CPU_ISA", "scalar, avx2 or avx512", env);
}

std::atomic<GemmIsa>& current() {
  static std::atomic<GemmIsa> isa{from_environment()};
  return isa;
}

}  // namespace

const char* isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Scalar: return "scalar";
    case GemmIsa::Avx2: return "avx2";
    case GemmIsa::Avx512: return "avx512";
  }
  return "?";
}

bool cpu_has(GemmIsa isa) {
#if defined(__x86_64__)
  if (isa == GemmIsa::Avx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == GemmIsa::Avx512) return __builtin_cpu_supports("avx512f");
#endif
  return isa == GemmIsa::Scalar;
}

GemmIsa gemm_isa() { return current().load(); }

void set_gemm_isa(GemmIsa isa) {
  if (!cpu_has(isa)) fail("set_gemm_isa", "an instruction set this CPU has", isa_name(isa));
  current().store(isa);
}

void gemm_f32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y, int64_t ldy) {
  if (M <= 0 || N <= 0) return;
  switch (gemm_isa()) {
#if defined(__x86_64__)
    case GemmIsa::Avx512: return gemm_with<Avx512Tile, 4, 4>(x, M, w, N, K, y, ldy);
    case GemmIsa::Avx2: return gemm_with<Avx2Tile, 2, 2>(x, M, w, N, K, y, ldy);
#endif
    default: return gemm_with<ScalarTile, 1, 1>(x, M, w, N, K, y, ldy);
  }
}

}  // namespace dsv41
