// Weight GEMV/GEMM reading checkpoint formats directly (fp8 32x32-block, fp4 per-32, bf16, fp32).
//
// Two kernels here, and the GEMMs on the tensor cores: linear() over fp8/fp4 weights at M ≥ 2
// (gemm::kMinRows) with K a multiple of 128 runs in gemm.cu, every product over a bf16 weight at
// M ≥ 2 (gemm_bf16::kMinRows) in gemm_bf16.cu.
//
// qgemv (linear() over fp8/fp4 weights: one row, or K not a multiple of 128): the activation quantization is folded
// into the GEMV. Each block first act-quantizes its slice of x (≤ 8 rows) into shared memory,
// then groups of L lanes each stream R weight rows in 16-byte loads (16 fp8 or 32 fp4 codes),
// decode them in registers and multiply them against the quantized x. The weight never passes
// through shared memory and is read exactly once; x is re-read from L2 by every block (N/rows per
// block times M·K·4 bytes: 1/16–1/32 of the weight's bytes at M = 1). Memory traffic:
// bytes(W) + scales + M·K·4 (x, from HBM once) + M·N·4 (y), so at M ≤ 8 the floor is
// bytes(W) / HBM bandwidth; at M = 8 the 8 FMAs per weight element make it compute-bound on the
// CUDA cores.
//
// gemv (linear() over bf16/fp32 weights, and linear_f32 in every format): each group of T threads
// owns kRows output rows and walks them in 16-byte chunks (16 fp8, 32 fp4, 8 bf16 or 4 fp32
// elements), reading x as fp32 through L1, up to kMaxRows activation rows per pass.
//
// Precision flow of the CPU op (backend/cpu/linear.cpp): x is first act-quantized to e4m3 × a
// power-of-two scale per 32 (bit-exact with act_quant_fp8: the same scale function, and the
// hardware's e4m3 rounding, which numerics_test checks against the CPU encoder on every fp32
// value); each 32-block's exact products are summed in fp32 and multiplied by the weight's
// power-of-two block scale; block results are summed in fp32 and y is rounded to bf16. Only the
// order of the fp32 sums differs from the CPU's.
#include "backend/cuda/linear.h"

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/gemm_bf16.cuh"
#include "backend/cuda/pdl.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kMaxRows = 8;  // activation rows per pass over the weight
constexpr int kRows = 2;     // weight rows per thread group, sharing each x load
constexpr int kBlock = 32;   // quantization block along K

// ---- gemv: bf16/fp32 weights, and linear_f32 -------------------------------------------------------

template <WeightFormat F>
struct Format;
template <>
struct Format<WeightFormat::FP8> {
  static constexpr int kElems = 16;  // per 16-byte chunk
  static constexpr float kUnscale = kE4m3Unscale;
  __device__ static void decode(uint4 c, float* v) {
    e4m3x4(c.x, v), e4m3x4(c.y, v + 4), e4m3x4(c.z, v + 8), e4m3x4(c.w, v + 12);
  }
};
template <>
struct Format<WeightFormat::FP4> {
  static constexpr int kElems = 32;
  static constexpr float kUnscale = kE2m1Unscale;
  __device__ static void decode(uint4 c, float* v) {
    e2m1x8(c.x, v), e2m1x8(c.y, v + 8), e2m1x8(c.z, v + 16), e2m1x8(c.w, v + 24);
  }
};
template <>
struct Format<WeightFormat::BF16> {
  static constexpr int kElems = 8;
  __device__ static void decode(uint4 c, float* v) {
    const uint32_t w[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) v[2 * i] = __uint_as_float(w[i] << 16), v[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
  }
};
template <>
struct Format<WeightFormat::F32> {
  static constexpr int kElems = 4;
  __device__ static void decode(uint4 c, float* v) {
    v[0] = __uint_as_float(c.x), v[1] = __uint_as_float(c.y), v[2] = __uint_as_float(c.z), v[3] = __uint_as_float(c.w);
  }
};

// The weight block scale of row n, block b (fp8: one per 32x32 tile; fp4: one per 32 of a row).
template <WeightFormat F>
__device__ inline float block_scale(const uint8_t* scale, int64_t n, int64_t b, int64_t K) {
  if constexpr (F == WeightFormat::FP8) return e8m0_to_float(scale[(n / kBlock) * ((K + kBlock - 1) / kBlock) + b]);
  else return e8m0_to_float(scale[n * (K / kBlock) + b]);
}

// y[m, n] for m < MT (MT ≤ kMaxRows rows of x) and this block's rows n. A group of T threads (a
// multiple of 32) owns kRows consecutive output rows: each thread loads one 16-byte chunk of each
// of them per step and reuses the x values it loaded for all of them, so x moves through L1
// kRows times less often than W's bytes would make it. Row m of x starts at x + m·ldx; output row
// n reads the K values at (n / group_rows)·K in it (group_rows = N: one input for all rows; less
// for a grouped product, whose groups of rows each have their own input).
template <WeightFormat F, int MT, int T>
__global__ void __launch_bounds__(kThreads) gemv_kernel(const float* __restrict__ x, int64_t ldx, int64_t group_rows,
                                                       int64_t N, int64_t K, const uint8_t* __restrict__ w,
                                                       const uint8_t* __restrict__ scale, float* __restrict__ y,
                                                       bool round) {
  wait_for_inputs();
  using Fmt = Format<F>;
  constexpr int E = Fmt::kElems;
  constexpr bool kQuantized = F == WeightFormat::FP8 || F == WeightFormat::FP4;
  constexpr int R = kRows;
  constexpr int kRowsPerBlock = kThreads / T * R;
  const int t = threadIdx.x % T;
  const int64_t n0 = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / T * R;
  const int64_t chunks = K / E;
  x += (n0 < N ? n0 : 0) / group_rows * K;  // group_rows is even, so the R = 2 rows share a group
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wrow[r] = reinterpret_cast<const uint4*>(w) + (n0 + r < N ? n0 + r : 0) * chunks;

  float acc[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0;

  const int64_t iterations = (chunks + T - 1) / T;  // the same for every thread: shuffles stay uniform
#pragma unroll 2
  for (int64_t i = 0; i < iterations; ++i) {
    const int64_t c = t + i * T;
    const bool valid = c < chunks;
    // Every row's chunk loaded (zeros where none), then decoded: decoded inside its guard, a chunk
    // was waited for before the next row's load went out.
    uint4 raw[R];
#pragma unroll
    for (int r = 0; r < R; ++r) raw[r] = valid && n0 + r < N ? __ldg(wrow[r] + c) : make_uint4(0, 0, 0, 0);
    float v[R][E];
#pragma unroll
    for (int r = 0; r < R; ++r) Fmt::decode(raw[r], v[r]);
    float partial[R][MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
      for (int r = 0; r < R; ++r) partial[r][m] = 0;
      if (valid) {
        const float4* xr = reinterpret_cast<const float4*>(x + m * ldx + c * E);
#pragma unroll
        for (int e = 0; e < E / 4; ++e) {
          const float4 xv = __ldg(xr + e);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            partial[r][m] = fmaf(xv.x, v[r][4 * e], partial[r][m]);
            partial[r][m] = fmaf(xv.y, v[r][4 * e + 1], partial[r][m]);
            partial[r][m] = fmaf(xv.z, v[r][4 * e + 2], partial[r][m]);
            partial[r][m] = fmaf(xv.w, v[r][4 * e + 3], partial[r][m]);
          }
        }
      }
    }
    if constexpr (kQuantized) {
      // A 32-block is one fp4 chunk, or two fp8 chunks held by neighbouring threads (T is even).
      if constexpr (F == WeightFormat::FP8) {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int m = 0; m < MT; ++m) partial[r][m] += __shfl_xor_sync(0xFFFFFFFFu, partial[r][m], 1);
      }
      const bool owner = F == WeightFormat::FP4 || c % 2 == 0;
      if (valid && owner) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (n0 + r >= N) continue;
          const float s = block_scale<F>(scale, n0 + r, c * E / kBlock, K);
#pragma unroll
          for (int m = 0; m < MT; ++m) acc[r][m] += (partial[r][m] * Fmt::kUnscale) * s;
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[r][m] += partial[r][m];
    }
  }

  // Sum over the T threads of the group: within each warp, then across the group's warps.
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
      for (int o = 16; o > 0; o /= 2) acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], o);
  __shared__ float sums[kThreads / 32][R * MT];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) sums[warp][r * MT + m] = acc[r][m];
  __syncthreads();
  if (t < R * MT) {
    const int r = t / MT, m = t % MT;
    const int first = threadIdx.x / T * (T / 32);
    float s = 0;
    for (int k = 0; k < T / 32; ++k) s += sums[first + k][t];
    if (n0 + r < N) y[m * N + n0 + r] = round ? round_bf16(s) : s;
  }
}

// ---- qgemv: fp8/fp4 weights, act-quant folded in ----------------------------------------------

constexpr int kQThreads = 256;
constexpr int kQSmemBytes = 48 * 1024;  // the quantized x slice (fp32), no opt-in needed


// act_quant of x[m, 0..kn) for m < M into xs (the layout above; C = kn / kElems chunks per row):
// 4 threads per 32-block, 8 values each. Per value: one multiply by the exact reciprocal of the
// power-of-two scale (equal to the CPU's division), the hardware e4m3 rounding, one multiply back.
template <WeightFormat F>
__device__ void quantize_slice(const float* __restrict__ x, int64_t K, int M, int kn, float4* xs) {
  using Fmt = QFormat<F>;
  constexpr int P = Fmt::kElems / 4;
  const int per_row = kn / 8, C = kn / Fmt::kElems, items = M * per_row;  // items: a multiple of 4
  for (int base = 0; base < items; base += kQThreads) {  // the same trip count in every thread: shuffles stay whole
    const int i = base + int(threadIdx.x);
    const bool on = i < items;
    const int m = on ? i / per_row : 0, q = on ? i % per_row : 0;
    float v[8];
    const float amax = load8_block_amax(x + m * K + 8 * q, on, v);
    if (!on) continue;
    const float scale = swa_fp8::block_scale(amax), inv = 1.0f / scale;  // a power of two: inv is exact
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const float2 r = e4m3_round2(v[e] * inv, v[e + 1] * inv);
      v[e] = r.x * scale, v[e + 1] = r.y * scale;
    }
    float4 lo, hi;
    Fmt::parts(v, lo, hi);
    const int c = 8 * q / Fmt::kElems, p = 8 * q % Fmt::kElems / 4;
    xs[(m * P + p) * C + c] = lo;
    xs[(m * P + p + 1) * C + c] = hi;
  }
}

// One chunk c (of C in the slice) of R rows against the MT quantized x rows: the block partials
// (exact products summed in fp32), times the weight block scale (weight_scale of its code ws) into acc.
// An fp8 chunk is half a 32-block: its two halves are scaled separately, exactly (the scale is a
// power of two), so only the order of the fp32 additions differs from the CPU's.
template <WeightFormat F, int MT, int R>
__device__ __forceinline__ void chunk_fma(const uint4 (&wv)[R], const uint8_t (&ws)[R], const float4* xs, int C, int c,
                                          int M, float (&acc)[R][MT]) {
  constexpr int P = QFormat<F>::kElems / 4;
  float p[R][MT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) p[r][m] = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // the chunk's four 32-bit words
    if constexpr (F == WeightFormat::FP8) {
      float4 xv[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) xv[m] = m < M ? xs[(m * P + j) * C + c] : make_float4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
        float2 a, b;
        QFormat<F>::word(w, a, b);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          p[r][m] = fmaf(a.x, xv[m].x, p[r][m]), p[r][m] = fmaf(a.y, xv[m].y, p[r][m]);
          p[r][m] = fmaf(b.x, xv[m].z, p[r][m]), p[r][m] = fmaf(b.y, xv[m].w, p[r][m]);
        }
      }
    } else {
      float4 xa[MT], xb[MT];
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        xa[m] = m < M ? xs[(m * P + 2 * j) * C + c] : make_float4(0, 0, 0, 0);
        xb[m] = m < M ? xs[(m * P + 2 * j + 1) * C + c] : make_float4(0, 0, 0, 0);
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t w = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
        float2 a, b, cc, d;
        QFormat<F>::word(w, a, b, cc, d);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          p[r][m] = fmaf(a.x, xa[m].x, p[r][m]), p[r][m] = fmaf(a.y, xa[m].y, p[r][m]);
          p[r][m] = fmaf(b.x, xa[m].z, p[r][m]), p[r][m] = fmaf(b.y, xa[m].w, p[r][m]);
          p[r][m] = fmaf(cc.x, xb[m].x, p[r][m]), p[r][m] = fmaf(cc.y, xb[m].y, p[r][m]);
          p[r][m] = fmaf(d.x, xb[m].z, p[r][m]), p[r][m] = fmaf(d.y, xb[m].w, p[r][m]);
        }
      }
    }
  }
  // p·s is exact (s a power of two), so the fused add rounds once, as the CPU's acc += dot·s.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = weight_scale<F>(ws[r]);
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = fmaf(p[r][m], s, acc[r][m]);
  }
}

// y[m, n] = bf16(Σ_K xq[m]·W[n]) for m < M ≤ MT. Groups of L lanes (a divisor of 32) each own R
// consecutive rows (R | 32, so an fp8 group's rows share one 32-row scale tile) and walk them in
// steps of L·U chunks: U·R independent 16-byte loads in flight per lane, the next step's issued
// before this step's are multiplied, the first before x is quantized. K is processed in
// slices of `slice` values (x[:, slice] quantized into shared memory, then the weight's columns of
// that slice), one slice whenever M·K·4 fits in 48 KB (always at M = 1 for K ≤ 12288).
// Row groups: block b takes groups b, b + gridDim.x, ... of kQThreads / L · R rows. With one
// slice the grid is what the GPU holds at once and each block quantizes x once for all its row
// groups; its warps then stream independently (no barrier between row groups), so at one row
// the SMs keep loads in flight instead of paying a block's start, x and barrier per ~16 rows.
// With several slices every block has one row group (x is re-quantized per slice).
template <WeightFormat F, int MT, int L, int R>
__global__ void __launch_bounds__(kQThreads) qgemv_kernel(const float* __restrict__ x, int M, int64_t N, int64_t K,
                                                         int slice, const uint8_t* __restrict__ w,
                                                         const uint8_t* __restrict__ scale, float* __restrict__ y) {
  using Fmt = QFormat<F>;
  constexpr int E = Fmt::kElems;
  constexpr int U = MT <= 2 ? 4 : 1;  // chunks per row and step: U·R loads in flight, twice over
  constexpr int kGroups = kQThreads / L;
  extern __shared__ float4 xs[];
  const int lane = int(threadIdx.x) % L;
  const int64_t row_chunks = K / E, blocks = K / kBlock, row_groups = (N + kGroups * R - 1) / (kGroups * R);
  uint4 wv[U][R], nv[U][R];  // this step's chunks, the next step's (in flight during this one's math)
  uint8_t ws[U][R], ns[U][R];  // their blocks' scale codes
  const uint4* wrow[R];
  bool live[R];
  int64_t n0 = 0;
  // The U·R chunks of the lane's step from chunk c0 + c of its rows on (zeros past C or N).
  auto fetch = [&](int64_t c0, int c, int C, uint4 (&wv)[U][R], uint8_t (&ws)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = c + u * L;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = cu < C && live[r];
        wv[u][r] = ok ? load_stream(wrow[r] + c0 + cu) : make_uint4(0, 0, 0, 0);
        // The weight block of chunk c0 + cu: fp8 one scale per 32 rows × 32 columns, fp4 one per
        // row × 32 columns (= one chunk).
        const int64_t s = F == WeightFormat::FP8 ? (n0 / kBlock) * blocks + (c0 + cu) * E / kBlock
                                                 : (n0 + r) * blocks + c0 + cu;
        ws[u][r] = ok ? scale[s] : uint8_t(0);
      }
    }
  };
  for (int64_t g = blockIdx.x; g < row_groups; g += gridDim.x) {
    const bool first = g == int64_t(blockIdx.x);
    n0 = (g * kGroups + threadIdx.x / L) * R;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      live[r] = n0 + r < N;
      wrow[r] = reinterpret_cast<const uint4*>(w) + (live[r] ? n0 + r : 0) * row_chunks;
    }
    float acc[R][MT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[r][m] = 0;

    for (int64_t k0 = 0; k0 < K; k0 += slice) {
      const int kn = int(K - k0 < slice ? K - k0 : slice), C = kn / E;
      const int64_t c0 = k0 / E;
      fetch(c0, lane, C, wv, ws);  // the first step's loads go out before the block waits on x,
      wait_for_inputs();           // and, launched early, before the kernel before it ends
      if (first || slice < K) {    // block-uniform: the barriers below are whole
        if (!first || k0 > 0) __syncthreads();  // every lane is done with the previous slice's x
        quantize_slice<F>(x + k0, K, M, kn, xs);
        __syncthreads();
      }
      for (int c = lane; c < C; c += L * U) {
        fetch(c0, c + L * U, C, nv, ns);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (c + u * L < C) chunk_fma<F, MT, R>(wv[u], ws[u], xs, C, c + u * L, M, acc);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < R; ++r) wv[u][r] = nv[u][r], ws[u][r] = ns[u][r];
      }
    }

    // Sum over the group's L lanes; lane e % L writes output e = r·MT + m.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int o = L / 2; o > 0; o /= 2) acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], o);
#pragma unroll
    for (int e = 0; e < R * MT; ++e) {
      const int r = e / MT, m = e % MT;
      if (lane == e % L && m < M && live[r]) y[m * N + n0 + r] = round_bf16(acc[r][m]);
    }
  }
}

template <WeightFormat F, int MT, int L, int R>
void qlaunch(const float* x, int M, int64_t N, int64_t K, const Weight& w, float* y, cudaStream_t stream) {
  constexpr int chunk = L * QFormat<F>::kElems;  // K covered by one step of a group
  const int64_t fit = kQSmemBytes / (MT * 4) / chunk * chunk;
  const int slice = int(K < fit ? K : fit);
  const int64_t rows_per_block = int64_t(kQThreads / L) * R;
  const int64_t row_groups = (N + rows_per_block - 1) / rows_per_block;
  static const int resident = resident_blocks(qgemv_kernel<F, MT, L, R>, kQThreads, kQSmemBytes, "cuda::linear");
  const unsigned grid = unsigned(slice < K ? row_groups : std::min<int64_t>(row_groups, resident));
  launch_early("cuda::linear", qgemv_kernel<F, MT, L, R>, grid, kQThreads, size_t(MT) * slice * 4, stream, x, M, N, K,
               slice, w.data, w.scale, y);
}

template <WeightFormat F, int MT>
void qlaunch_shape(const float* x, int M, int64_t N, int64_t K, const Weight& w, float* y, cudaStream_t stream) {
  // L: the widest group whose steps waste at most 1/8 of their lanes on K (fp8 wq_b: 80 chunks,
  // L = 16; fp4 w2: 72 chunks, L = 16; the 512/320/256/160-chunk rows: L = 32).
  const int64_t chunks = K / QFormat<F>::kElems;
  auto fits = [&](int64_t l) { return (chunks + l - 1) / l * l * 8 <= chunks * 9; };
  const int L = fits(32) ? 32 : fits(16) ? 16 : 8;
  // R = 2 (each x load serves two rows) while that still leaves two blocks per SM; else R = 1.
  const int sms = multiprocessors("cuda::linear");
  const bool two = N / (int64_t(kQThreads / L) * 2) >= 2 * sms;
  switch (L * 2 + (two ? 1 : 0)) {
    case 65: return qlaunch<F, MT, 32, 2>(x, M, N, K, w, y, stream);
    case 64: return qlaunch<F, MT, 32, 1>(x, M, N, K, w, y, stream);
    case 33: return qlaunch<F, MT, 16, 2>(x, M, N, K, w, y, stream);
    case 32: return qlaunch<F, MT, 16, 1>(x, M, N, K, w, y, stream);
    case 17: return qlaunch<F, MT, 8, 2>(x, M, N, K, w, y, stream);
    default: return qlaunch<F, MT, 8, 1>(x, M, N, K, w, y, stream);
  }
}

template <WeightFormat F>
void qlinear(const float* x, int64_t M, int64_t N, int64_t K, const Weight& w, float* y, cudaStream_t stream) {
  // Passes of up to kMaxRows activation rows; M > kMaxRows (prefill) re-reads W once per pass.
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
    const int rows = int(M - m0 < kMaxRows ? M - m0 : kMaxRows);
    const float* xr = x + m0 * K;
    float* yr = y + m0 * N;
    if (rows == 1) qlaunch_shape<F, 1>(xr, rows, N, K, w, yr, stream);
    else if (rows == 2) qlaunch_shape<F, 2>(xr, rows, N, K, w, yr, stream);
    else if (rows <= 4) qlaunch_shape<F, 4>(xr, rows, N, K, w, yr, stream);
    else qlaunch_shape<F, 8>(xr, rows, N, K, w, yr, stream);
  }
}

template <WeightFormat F, int MT>
void launch_rows(const float* x, int64_t ldx, int64_t group_rows, int64_t N, int64_t K, const Weight& w, float* y,
                 bool round, cudaStream_t stream) {
  // T: enough threads per group for about four chunks each, between one and eight warps.
  const int64_t chunks = K / Format<F>::kElems;
  const int64_t want = chunks / (32 * 4);
  const int warps = want >= 8 ? 8 : (want >= 4 ? 4 : (want >= 2 ? 2 : 1));
  auto grid = [&](int T) {
    const int64_t rows_per_block = kThreads / T * kRows;
    return unsigned((N + rows_per_block - 1) / rows_per_block);
  };
  const auto run = [&](auto kernel, int T) {
    launch_early("cuda::linear", kernel, grid(T), kThreads, 0, stream, x, ldx, group_rows, N, K, w.data, w.scale, y, round);
  };
  switch (warps) {
    case 1: run(gemv_kernel<F, MT, 32>, 32); break;
    case 2: run(gemv_kernel<F, MT, 64>, 64); break;
    case 4: run(gemv_kernel<F, MT, 128>, 128); break;
    default: run(gemv_kernel<F, MT, 256>, 256); break;
  }
}

template <WeightFormat F>
void launch(const float* x, int64_t M, int64_t groups, int64_t N, int64_t K, const Weight& w, float* y, bool round,
            cudaStream_t stream) {
  // Passes of up to kMaxRows activation rows; M > kMaxRows (prefill) re-reads W once per pass.
  const int64_t ldx = groups * K, group_rows = N / groups;
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
    const int64_t rows = M - m0 < kMaxRows ? M - m0 : kMaxRows;
    const float* xr = x + m0 * ldx;
    float* yr = y + m0 * N;
    switch (rows) {
      case 1: launch_rows<F, 1>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      case 2: launch_rows<F, 2>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      case 3: launch_rows<F, 3>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      case 4: launch_rows<F, 4>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      case 5: launch_rows<F, 5>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      case 6: launch_rows<F, 6>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      case 7: launch_rows<F, 7>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
      default: launch_rows<F, 8>(xr, ldx, group_rows, N, K, w, yr, round, stream); break;
    }
  }
}

// The gemv over all of the weight's rows, in `groups` groups with their own inputs (1: a plain product).
void dispatch(const float* x, int64_t M, const Weight& w, float* y, bool round, cudaStream_t stream, int64_t groups = 1) {
  const int64_t N = w.rows, K = w.cols;
  if (M <= 0 || N <= 0) return;
  // 16-byte chunks need every row to start on a 16-byte boundary and hold whole chunks.
  const int64_t multiple = w.quantized() ? kBlock : (w.format == WeightFormat::BF16 ? 8 : 4);
  if (K % multiple != 0)
    fail("cuda::linear", "K a multiple of " + std::to_string(multiple), "K = " + std::to_string(K));
  switch (w.format) {
    case WeightFormat::FP8: return launch<WeightFormat::FP8>(x, M, groups, N, K, w, y, round, stream);
    case WeightFormat::FP4: return launch<WeightFormat::FP4>(x, M, groups, N, K, w, y, round, stream);
    case WeightFormat::BF16: return launch<WeightFormat::BF16>(x, M, groups, N, K, w, y, round, stream);
    case WeightFormat::F32: return launch<WeightFormat::F32>(x, M, groups, N, K, w, y, round, stream);
  }
}

}  // namespace

void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream) {
  if (gemm_bf16::usable(M, w)) return gemm_bf16::linear(x, M, 1, w, y, true, stream);
  if (!w.quantized()) return dispatch(x, M, w, y, true, stream);
  if (w.cols % kBlock != 0)
    fail("cuda::linear", "K a multiple of 32 for a quantized weight", "K = " + std::to_string(w.cols));
  if (M <= 0 || w.rows <= 0) return;
  // M ≥ gemm::kMinRows, K a multiple of 128: the tensor-core GEMM (gemm.cu), same precision flow.
  if (gemm::usable(M, w)) return gemm::linear(x, M, w, y, stream);
  if (w.format == WeightFormat::FP8) qlinear<WeightFormat::FP8>(x, M, w.rows, w.cols, w, y, stream);
  else qlinear<WeightFormat::FP4>(x, M, w.rows, w.cols, w, y, stream);
}

void linear_f32(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream) {
  if (gemm_bf16::usable(M, w)) return gemm_bf16::linear(x, M, 1, w, y, false, stream);
  dispatch(x, M, w, y, false, stream);
}

void linear_grouped_widened(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, cudaStream_t stream) {
  // Between the swapped form's few rows and prefill's warpgroup GEMM (decode batches, short turns):
  // the fp8 GEMM's narrow warpgroup tiles with x as it is, one weight tile widened for up to 64
  // rows, where gemm_bf16's mma.sync tile of 128 rows ran half empty at batch 64.
  if (M > gemm_bf16::kSwapRows && M < gemm_bf16::kWgRows && gemm_bf16::usable_fp8(w, groups) &&
      gemm::usable_groups(M, groups, w))
    return gemm::linear_groups(x, M, groups, w, y, /*quantize=*/false, stream);
  gemm_bf16::linear_fp8(x, M, groups, w, y, true, stream);
}

bool widened_usable(const Weight& w, int64_t groups) { return gemm_bf16::usable_fp8(w, groups); }

void linear_grouped(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, cudaStream_t stream) {
  if (groups <= 0 || w.rows % groups != 0)
    fail("cuda::linear_grouped", "a weight whose rows split into the groups evenly",
         std::to_string(groups) + " groups of " + std::to_string(w.rows) + " rows");
  if (groups == 1) return linear(x, M, w, y, stream);
  if (gemm_bf16::usable(M, w, groups)) return gemm_bf16::linear(x, M, groups, w, y, true, stream);
  const int64_t r = w.rows / groups, K = w.cols;
  // One gemv launch over every group (bf16/fp32 weights: rows independent, no act-quant; a
  // thread's kRows rows in one group). Otherwise each group is one linear() on a contiguous copy
  // of its inputs.
  if (!w.quantized() && r % kRows == 0) return dispatch(x, M, w, y, true, stream, groups);
  if (w.format == WeightFormat::FP8 && r % kBlock != 0)
    fail("cuda::linear_grouped", "groups of whole 32-row scale blocks for an fp8 weight", std::to_string(r) + " rows a group");
  float *xg = nullptr, *yg = nullptr;
  keep_scratch_pool();
  check(cudaMallocAsync(reinterpret_cast<void**>(&xg), size_t(M * K) * sizeof(float), stream), "cuda::linear_grouped");
  check(cudaMallocAsync(reinterpret_cast<void**>(&yg), size_t(M * r) * sizeof(float), stream), "cuda::linear_grouped");
  for (int64_t g = 0; g < groups; ++g) {
    Weight wg = w;
    wg.rows = r;
    wg.data = w.data + g * w.data_bytes() / groups;
    if (w.scale) wg.scale = w.scale + g * w.scale_bytes() / groups;
    check(cudaMemcpy2DAsync(xg, K * 4, x + g * K, groups * K * 4, K * 4, M, cudaMemcpyDeviceToDevice, stream), "cuda::linear_grouped");
    linear(xg, M, wg, yg, stream);
    check(cudaMemcpy2DAsync(y + g * r, groups * r * 4, yg, r * 4, r * 4, M, cudaMemcpyDeviceToDevice, stream), "cuda::linear_grouped");
  }
  check(cudaFreeAsync(xg, stream), "cuda::linear_grouped");
  check(cudaFreeAsync(yg, stream), "cuda::linear_grouped");
}

}  // namespace dsv41::cuda
