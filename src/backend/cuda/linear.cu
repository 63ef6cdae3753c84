// Weight GEMV/GEMM reading checkpoint formats directly (fp8 32x32-block, fp4 per-32, bf16, fp32).
//
// linear() over fp8/fp4 weights runs on the tensor cores: at M ≥ 2 (gemm::kMinRows) with K a
// multiple of 128 the GEMM (gemm.cu), else the quantized GEMV (qgemv.cu, one or two rows a pass);
// every product over a bf16 weight at M ≥ 2 (gemm_bf16::kMinRows) in gemm_bf16.cu.
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
#include "backend/cuda/qgemv.cuh"
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
  qgemv::linear(x, M, w, y, stream);
}

void linear_f32(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream) {
  if (gemm_bf16::usable(M, w)) return gemm_bf16::linear(x, M, 1, w, y, false, stream);
  dispatch(x, M, w, y, false, stream);
}

void linear_grouped_widened(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, cudaStream_t stream) {
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
