// The GEMM over bf16 weights: y[M, N] = x[M, K] · Wᵀ on the tensor cores through bf16 mma.sync
// (m16n8k16, fp32 accumulation) or, for prefill, the warpgroup MMA (wgmma), for wo_a (grouped),
// the compressor's projections and the indexer's bf16 weights, which the gemv (linear.cu)
// otherwise reads once per 8 rows; and over fp8 codes multiplied as their bf16 values (wo_a on the
// device, linear_fp8), widened as they are loaded.
//
// Two steps.
//
// cuda::to_bf16 (rows.h): x (fp32 storage of bf16 values, the activations' dtype) → bf16, exactly.
// Traffic M·K·(4 + 2) bytes: 0.2 ms for wo_a's input at M = 4096 (32768 columns).
//
// gemm_kernel: CTA tile 128 (M) × 128 (N) × 64 (K), 8 warps as 2 (M) × 4 (N), warp tile 64 × 32
// (4 × 4 mma tiles, 64 fp32 accumulators a thread). Both operands are K-contiguous rows (x [M, K],
// W [N, K]: the mma's row.col form) and go global → shared memory by cp.async, 16-byte chunks,
// 3 stages (96 KB, 2 CTAs per SM), each 128-byte row's 8 chunks XOR-swizzled by the row's low
// 3 bits so that ldmatrix's 8 rows of one chunk column hit 32 distinct banks; shared → registers
// by ldmatrix (x4: an A fragment of 16 × 16, or the B fragments of two n8 tiles). Rows past M or
// N and chunks past K are zero-filled (K is a multiple of 8, so a chunk is wholly in or out).
// Groups (linear_grouped) are gridDim.z, each with its own x columns, weight rows and y columns.
// Split-K (rows.h split_k) when the tiles would leave most SMs idle (decode batches: the gate's
// 16 experts are one tile, wo_a's 8 groups 64): each of gridDim.z's splits sums ≥ 4 k-steps into
// its own fp32 partial, and sum_splits adds them in order (then rounds, for linear).
//
// The warpgroup form (wg_kernel), from kWgRows rows with K a multiple of 64 (prefill): CTA tile
// 128 (M) × 256 (N) × 64 (K), one producer thread filling 4 stages of 48 KB by the tensor copy
// engine (x's box [128 rows, 64] and W's [256 rows, 64], swizzled 128B: the layout wgmma reads
// K-major), two consumer warpgroups each issuing wgmma m64n256k16 for 64 x rows, both operands
// from shared memory, the accumulators in registers (128 a thread). Grid (N tile, M tile, group), N tiles fastest, so the
// CTAs resident together share one group's weight and each x tile from L2. HBM traffic as below;
// the tensor cores bound it at wgmma's rate instead of mma.sync's.
//
// Precision: the products of bf16 values are exact in fp32 and the tensor cores sum them at fp32
// width (aligning and truncating, where the CPU's gemm_f32 rounds each add in its own order), so
// y differs from the CPU's by the order and the rounding of fp32 sums only: a few fp32 units
// relative to the terms (ops_linear_test states the bounds). y is rounded to bf16 when asked, as
// the CPU's linear() rounds its fp32 product.
//
// Speed of light (H200: ~990 TFLOP/s dense bf16 by the datasheet, ~790 measured through PyTorch;
// mma.sync reaches roughly two thirds of the wgmma rate). wo_a at M = 4096 (8 groups of 1024 ×
// 4096): 275 GFLOP, bytes W 64 MB + x 256 MB (bf16) + y 128 MB → ~0.1 ms of HBM time, so the
// tensor cores bound it: ~0.35 ms at 790 TFLOP/s. The gemv's 512 passes of 8 rows read W 512
// times.
#include "backend/cuda/gemm_bf16.cuh"

#include <cuda_bf16.h>

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rows.h"
#include "backend/cuda/wgmma.cuh"
#include "numerics/types.h"

namespace dsv41::cuda::gemm_bf16 {

namespace {

using namespace ptx;

constexpr int kBM = 128, kBN = 128, kBK = 64;  // CTA tile; kBK in bf16 elements (128 bytes a row)
constexpr int kThreads = 256;                  // 8 warps: 2 along M × 4 along N, warp tile 64 × 32
constexpr int kStages = 3;
constexpr int kRowBytes = kBK * 2;
constexpr int kTileBytes = kBM * kRowBytes;    // one operand's tile: 16 KB (kBN == kBM)
constexpr int kStageBytes = 2 * kTileBytes;
constexpr int kSmemBytes = kStages * kStageBytes;
constexpr int kMinSplitSteps = 4;  // k-steps per split of K, at least (a split's pipeline fills)

static_assert(kBM == kBN, "one tile size for both operands");

// The byte offset of chunk c (16 bytes) of row r within a tile.
__device__ __forceinline__ uint32_t swizzled(int r, int c) { return uint32_t(r * kRowBytes + ((c ^ (r & 7)) << 4)); }

// kFp8: w holds e4m3 codes with a ue8m0 scale per 32 × 32 block (wscale, K/32 a row of blocks),
// multiplied as their bf16 values (wo_a, whose checkpoint stores it so and whose reference
// dequantizes it): a stage takes a tile's codes, 64 bytes a row (rows padded to kFp8Row bytes,
// so that the fragment loads below fall into distinct banks), and each B fragment is widened from
// them, code · scale, exact in bf16 (dequant.cuh). The fragments then hold the bits ldmatrix reads
// from the bf16 weight, so the products and sums are the bf16 weight's, from half its bytes.
constexpr int kFp8Row = kBK + 16;
static_assert(kBN * kFp8Row <= kTileBytes, "a stage's codes fit in its W tile");

// Grid (N tile, M tile, group · splits + split). x [M, lda] bf16, group g's columns from g·K; w
// [groups·N, K], group g's rows from g·N; y [M, ldy], group g's columns from g·N. Split s of K
// (more than one: split_k, rows.h) takes the columns s·per·kBK .. of its group's K and writes its
// fp32 sums unrounded to y + s·M·ldy (a partial of the same layout; sum_splits finishes them).
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 2)
    gemm_kernel(const __nv_bfloat16* __restrict__ x, int lda, int M, int N, int K, const uint8_t* __restrict__ w,
                const uint8_t* __restrict__ wscale, float* __restrict__ y, int ldy, bool round, int splits, int per) {
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem0 = smem_addr(smem);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int wm = warp / 4, wn = warp % 4, g = lane / 4, t = lane % 4;
  const int n0 = int(blockIdx.x) * kBN, m0 = int(blockIdx.y) * kBM, group = int(blockIdx.z) / splits,
            split = int(blockIdx.z) % splits;
  const int ldw = K, k0 = split * per * kBK, kblocks = K / 32;
  constexpr int kWBytes = kFp8 ? 1 : 2;  // a weight element's
  x += int64_t(group) * K + k0;
  w += (int64_t(group) * N * K + k0) * kWBytes;
  // fp8: the scale row of this warp's 32 weight rows (one block: n0 and N are multiples of 32).
  if (kFp8) wscale += int64_t(group * N + min(n0 + wn * 32, N - 32)) / 32 * kblocks;
  y += int64_t(group) * N + int64_t(split) * M * ldy;
  if (splits > 1) K = min(K - k0, per * kBK), round = false;
  const int KT = (K + kBK - 1) / kBK;

  // This thread's 4 chunks of each operand per stage: rows tid/8 + 32q, chunk tid%8.
  const int row0 = tid / 8, chunk = tid % 8;
  auto load_stage = [&](int stage, int kt) {
    const uint32_t base = smem0 + uint32_t(stage * kStageBytes);
    const int k = kt * kBK + chunk * 8;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int r = row0 + 32 * q;
      const bool a_ok = m0 + r < M && k < K, b_ok = n0 + r < N && k < K;
      cp_async16(base + swizzled(r, chunk), a_ok ? x + int64_t(m0 + r) * lda + k : x, a_ok);
      if (!kFp8) cp_async16(base + kTileBytes + swizzled(r, chunk), b_ok ? w + (int64_t(n0 + r) * ldw + k) * 2 : w, b_ok);
    }
    if (kFp8) {
      // The codes: 4 chunks of 16 a row, two a thread (K is a multiple of kBK here).
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int r = tid / 4 + 64 * q, c = tid % 4, kc = kt * kBK + 16 * c;
        const bool ok = n0 + r < N && kc < K;
        cp_async16(base + kTileBytes + uint32_t(r * kFp8Row + 16 * c), ok ? w + int64_t(n0 + r) * ldw + kc : w, ok);
      }
    }
  };

  float acc[4][4][4] = {};

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage kt has landed for every thread; stage kt - 1's reads are done
    if (kt + kStages - 1 < KT) load_stage((kt + kStages - 1) % kStages, kt + kStages - 1);
    cp_async_commit();
    const uint32_t a_base = smem0 + uint32_t(kt % kStages * kStageBytes), b_base = a_base + kTileBytes;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // A: matrices (rows 0-7 | 8-15) × (k 0-7 | 8-15) of each m16 tile; lane l names row l%16, chunk l/16.
      uint32_t a[4][4];
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) ldmatrix_x4(a[mt], a_base + swizzled(wm * 64 + mt * 16 + lane % 16, 2 * kk + lane / 16));
      // B: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) of a pair of n8 tiles.
      uint32_t b[4][2];
      if constexpr (kFp8) {
        // The fragment of n8 tile nt: row g's codes at k 2t, 2t + 1 (b0) and 2t + 8, 2t + 9 (b1).
        const uint32_t s = pow2_bf16x2(__ldg(wscale + (k0 + kt * kBK + kk * 16) / 32));
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const uint32_t at = b_base + uint32_t((wn * 32 + nt * 8 + g) * kFp8Row + kk * 16 + 2 * t);
          b[nt][0] = mul_bf16x2(e4m3x2_to_bf16(lds16(at)), s);
          b[nt][1] = mul_bf16x2(e4m3x2_to_bf16(lds16(at + 8)), s);
        }
      } else {
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          uint32_t r[4];
          ldmatrix_x4(r, b_base + swizzled(wn * 32 + np * 16 + lane / 16 * 8 + lane % 8, 2 * kk + lane / 8 % 2));
          b[2 * np][0] = r[0], b[2 * np][1] = r[1], b[2 * np + 1][0] = r[2], b[2 * np + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
  }

  // Accumulator (mt, nt): rows g and g + 8 of the m16 tile, columns 2t and 2t + 1 of the n8 tile.
  const bool pairs = (N % 2 == 0) && (ldy % 2 == 0);
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + wm * 64 + mt * 16 + g + 8 * h, n = n0 + wn * 32 + nt * 8 + 2 * t;
        if (m >= M || n >= N) continue;
        float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
        if (round) v0 = round_bf16(v0), v1 = round_bf16(v1);
        float* out = y + int64_t(m) * ldy + n;
        if (pairs) {
          *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
        } else {
          out[0] = v0;
          if (n + 1 < N) out[1] = v1;
        }
      }
}

// ---- the warpgroup form (prefill: M ≥ kWgRows, K a multiple of 64) ----

constexpr int kWgBM = 128, kWgBN = 256, kWgBK = 64;  // CTA tile: two consumers of 64 x rows each
constexpr int kWgThreads = 384;                      // consumers (warpgroups 0, 1), producer (2)
constexpr int kWgTileX = kWgBM * kWgBK * 2;          // 16 KB: x's k-tile
constexpr int kWgStage = kWgTileX + kWgBN * kWgBK * 2;  // + 32 KB: W's
constexpr int kWgStages = 4;
constexpr int kWgSmemBytes = kWgStages * kWgStage + 2 * kWgStages * 8 + 1024;  // + barriers, + alignment

// Grid (N tile, M tile, group), the N tiles fastest: the CTAs on the GPU at once share a group's
// weight (L2 holds it) and each x tile is read by its N tiles back to back. The producer (one
// thread) fills a ring of stages by the tensor copy engine: x's box [128 rows, 64] at column g·K +
// k, W's box [256 rows, 64] at row g·N + n0 (rows past the maps arrive as zeros; W rows past the
// group's N belong to the next group and are not stored). Consumer c multiplies x rows 64c.. by
// the 256 weight rows: 4 wgmma m64n256k16 per stage, both operands K-major from shared memory;
// a stage goes back once the MMAs of the stage after it have been issued and its own completed.
__global__ void __launch_bounds__(kWgThreads, 1)
    wg_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, int M, int N, int K,
              float* __restrict__ y, int ldy, bool round) {
  using namespace hopper;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = (smem_addr(smem_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte alignment
  const uint32_t full0 = smem0 + kWgStages * kWgStage, empty0 = full0 + 8 * kWgStages;
  const int tid = int(threadIdx.x), wg = tid / 128;
  const int n0 = int(blockIdx.x) * kWgBN, m0 = int(blockIdx.y) * kWgBM, group = int(blockIdx.z);
  const int KT = K / kWgBK;
  if (tid == 0) {
    for (int s = 0; s < kWgStages; ++s) {
      barrier_init(full0 + 8 * s, 1);
      barrier_init(empty0 + 8 * s, 256);
    }
    barrier_init_fence();
  }
  __syncthreads();

  if (wg == 2) {
    if (tid != 256) return;
    for (int kt = 0; kt < KT; ++kt) {
      const int s = kt % kWgStages;
      if (kt >= kWgStages) barrier_wait(empty0 + 8 * s, (kt / kWgStages - 1) & 1);
      const uint32_t base = smem0 + uint32_t(s * kWgStage), full = full0 + 8 * s;
      barrier_arrive_expect(full, kWgStage);
      tma_load_2d(base, &xmap, group * K + kt * kWgBK, m0, full);
      tma_load_2d(base + kWgTileX, &wmap, kt * kWgBK, group * N + n0, full);
    }
    return;
  }

  float acc[kWgBN / 2];
#pragma unroll
  for (int i = 0; i < kWgBN / 2; ++i) acc[i] = 0;
  keep(acc);
  for (int kt = 0; kt < KT; ++kt) {
    const int s = kt % kWgStages;
    barrier_wait(full0 + 8 * s, (kt / kWgStages) & 1);
    const uint32_t base = smem0 + uint32_t(s * kWgStage);
    const uint64_t a = kmajor_sw128(base + uint32_t(wg * 64 * 128)), b = kmajor_sw128(base + kWgTileX);
    mma_fence();
#pragma unroll
    for (int kk = 0; kk < kWgBK / 16; ++kk) mma_ss<kWgBN>(acc, a + uint64_t(kk * 2), b + uint64_t(kk * 2));
    mma_commit();
    // The previous stage's MMAs are complete once at most this stage's group is in flight.
    mma_wait<1>();
    barrier_arrive_if(empty0 + 8 * ((kt + kWgStages - 1) % kWgStages), kt > 0);
  }
  mma_wait<0>();
  keep(acc);

  // acc[4i + 2h + e]: x row 16·warp + g + 8h of the consumer's 64, weight row 8i + 2t + e.
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const bool pairs = N % 2 == 0 && ldy % 2 == 0;
  y += int64_t(group) * N;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m0 + wg * 64 + 16 * warp + g + 8 * h;
    if (m >= M) continue;
#pragma unroll
    for (int i = 0; i < kWgBN / 8; ++i) {
      const int n = n0 + 8 * i + 2 * t;
      float v0 = acc[4 * i + 2 * h], v1 = acc[4 * i + 2 * h + 1];
      if (round) v0 = round_bf16(v0), v1 = round_bf16(v1);
      float* out = y + int64_t(m) * ldy + n;
      if (pairs && n + 1 < N) {
        *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
      } else {
        if (n < N) out[0] = v0;
        if (n + 1 < N) out[1] = v1;
      }
    }
  }
}

// An fp8 weight's bf16 values (linear_fp8 at prefill sizes, for the warpgroup form): codes [rows,
// K] and their 32 × 32 block scales → out [rows, K], 8 values a thread, exact (dequant.cuh).
// Traffic rows·K·3 bytes.
__global__ void widen_kernel(const uint8_t* __restrict__ w, const uint8_t* __restrict__ scale, int64_t rows, int64_t K,
                             uint16_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * K / 8) return;
  const int64_t r = i * 8 / K, k = i * 8 % K;
  const uint2 codes = *reinterpret_cast<const uint2*>(w + i * 8);
  const uint32_t s = pow2_bf16x2(scale[r / 32 * (K / 32) + k / 32]);
  *reinterpret_cast<uint4*>(out + i * 8) =
      make_uint4(mul_bf16x2(e4m3x2_to_bf16(codes.x), s), mul_bf16x2(e4m3x2_to_bf16(codes.x >> 16), s),
                 mul_bf16x2(e4m3x2_to_bf16(codes.y), s), mul_bf16x2(e4m3x2_to_bf16(codes.y >> 16), s));
}

// ---- the swapped form (linear_fp8 at M ≤ kSwapRows: wo_a at decode) ----
//
// The weight's rows are the MMA's 16 rows and x's ≤ 8 rows its 8 columns (yᵀ = W · xᵀ), so no
// tensor-core row is padding and the codes go global → registers with no staging: a CTA of 8
// warps owns 32 weight rows (one scale block's), each warp every 8th k-step of 64 columns. In a
// step thread (g, q) (lane 4g + q) loads 16 codes of rows g, g + 8, g + 16, g + 24 at columns
// 16q .. 16q + 15 and x row g's same 16 values: word J of its codes fills its A slots of the k16
// MMA J (bytes 0, 2 at columns 2q, 2q + 1; bytes 1, 3 at 2q + 8, 2q + 9), and the B slots take the
// x values at the same columns, so each MMA sums the right products in a permuted k order. The
// codes widen by moving bits and one bf16 multiply by the folded scale (dequant.cuh), exactly the
// bf16 weight's values. The 8 warps' sums meet in shared memory, added in warp order.
// Traffic: the codes once (wo_a: 33.6 MB) + scales + x from L2 (≤ 8 · groups · K · 4 bytes).
constexpr int kSwapWarps = 8, kSwapRowsPerCta = 32, kSwapStep = 64;

__global__ void __launch_bounds__(kSwapWarps * 32, 2)
    swapped_kernel(const float* __restrict__ x, int M, int64_t ldx, int64_t group_rows, int64_t N, int64_t K,
                   const uint8_t* __restrict__ w, const uint8_t* __restrict__ scale, float* __restrict__ y, bool round) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const int64_t n0 = int64_t(blockIdx.x) * kSwapRowsPerCta;
  const uint8_t* wr = w + (n0 + g) * K + 16 * q;
  const uint8_t* sr = scale + n0 / 32 * (K / 32);
  const float* xr = x + g * ldx + n0 / group_rows * K + 16 * q;
  const bool has_x = g < M;
  float d[2][4] = {};
  wait_for_inputs();
#pragma unroll 2
  for (int64_t k = int64_t(warp) * kSwapStep; k < K; k += kSwapWarps * kSwapStep) {
    uint4 c[4];  // rows g, g + 8, g + 16, g + 24
#pragma unroll
    for (int r = 0; r < 4; ++r) c[r] = __ldg(reinterpret_cast<const uint4*>(wr + 8 * r * K + k));
    uint32_t b0[4] = {}, b1[4] = {};
    if (has_x) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(xr + k) + j);  // bf16 values: the top halves exact
        b0[j] = __byte_perm(__float_as_uint(v.x), __float_as_uint(v.z), 0x7632);
        b1[j] = __byte_perm(__float_as_uint(v.y), __float_as_uint(v.w), 0x7632);
      }
    }
    const uint32_t e = sr[(k + 16 * q) / 32];
    const bool rare = e >= 128;  // a scale of 2 or more (never in a trained checkpoint): gemm.cu's Rows
    const uint32_t s2 = rare ? pow2_bf16x2(e) : folded_scale_bf16x2<false>(e);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        uint32_t a[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t word = j == 0 ? c[2 * t + h].x : j == 1 ? c[2 * t + h].y : j == 2 ? c[2 * t + h].z : c[2 * t + h].w;
          uint32_t lo = e4m3x2_bits<0, 2>(word), hi = e4m3x2_bits<1, 3>(word);
          if (rare) lo = mul_bf16x2(lo, kE4m3Bits), hi = mul_bf16x2(hi, kE4m3Bits);
          a[h] = mul_bf16x2(lo, s2), a[2 + h] = mul_bf16x2(hi, s2);
        }
        mma_bf16(d[t], a, b0[j], b1[j]);
      }
    }
  }
  // d[t]: rows 16t + g (0, 1) and 16t + g + 8 (2, 3) of the CTA's, x rows 2q and 2q + 1.
  __shared__ float sums[kSwapWarps][kSwapRowsPerCta][8];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) sums[warp][16 * t + g + 8 * (i / 2)][2 * q + i % 2] = d[t][i];
  __syncthreads();
  const int row = threadIdx.x / 8, m = threadIdx.x % 8;
  if (m >= M) return;
  float sum = 0;
#pragma unroll
  for (int v = 0; v < kSwapWarps; ++v) sum += sums[v][row][m];
  y[m * N + n0 + row] = round ? round_bf16(sum) : sum;
}

// The mma.sync form over xb (x as bf16, [M, groups·K]): one pass over the weight, split over K
// when its tiles would leave most SMs idle.
template <bool kFp8>
void mma_product(const __nv_bfloat16* xb, int64_t M, int64_t groups, const Weight& w, float* y, bool round,
                 cudaStream_t stream) {
  static const bool configured = [] {
    check(cudaFuncSetAttribute(gemm_kernel<kFp8>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes),
          "cuda::linear bf16 gemm");
    return true;
  }();
  (void)configured;
  const int64_t K = w.cols, lda = groups * K, N = w.rows / groups;
  const int64_t tiles_n = (N + kBN - 1) / kBN, tiles_m = (M + kBM - 1) / kBM;
  const SplitK split = split_k(tiles_n * tiles_m * groups, (K + kBK - 1) / kBK, kMinSplitSteps);
  float* out = y;
  if (split.splits > 1)
    check(cudaMallocAsync(reinterpret_cast<void**>(&out), size_t(split.splits * M * w.rows) * 4, stream),
          "cuda::linear bf16 gemm");
  const dim3 grid(unsigned(tiles_n), unsigned(tiles_m), unsigned(groups * split.splits));
  gemm_kernel<kFp8><<<grid, kThreads, kSmemBytes, stream>>>(xb, int(lda), int(M), int(N), int(K), w.data, w.scale, out,
                                                            int(w.rows), round, split.splits, split.per);
  check_launch("cuda::linear bf16 gemm");
  if (split.splits > 1) {
    sum_splits(out, split.splits, M * w.rows, y, round, stream);
    check(cudaFreeAsync(out, stream), "cuda::linear bf16 gemm");
  }
}

}  // namespace

bool usable(int64_t M, const Weight& w, int64_t groups) {
  const int64_t limit = int64_t(1) << 31;
  return w.format == WeightFormat::BF16 && w.data && M >= kMinRows && groups > 0 && w.rows % groups == 0 &&
         w.rows > 0 && w.cols > 0 && w.cols % 8 == 0 && M < limit && groups * w.cols < limit && w.rows < limit &&
         (M + kBM) / kBM < 65536 && groups < 65536;
}

void linear(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, bool round, cudaStream_t stream) {
  if (!usable(M, w, groups))
    fail("cuda::linear bf16 gemm", "a bf16 weight, M >= " + std::to_string(kMinRows) + ", K % 8 == 0, rows in whole groups",
         std::to_string(M) + " rows over " + std::to_string(w.rows) + "x" + std::to_string(w.cols) + " in " +
             std::to_string(groups) + " groups");
  const int64_t K = w.cols, lda = groups * K, N = w.rows / groups, values = M * lda;
  keep_scratch_pool();
  __nv_bfloat16* xb = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&xb), size_t(values) * sizeof(__nv_bfloat16), stream), "cuda::linear bf16 gemm");
  to_bf16(x, values, reinterpret_cast<uint16_t*>(xb), stream);
  if (M >= kWgRows && K % kWgBK == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0) {
    static const bool wg_configured = [] {
      check(cudaFuncSetAttribute(wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWgSmemBytes),
            "cuda::linear bf16 gemm");
      return true;
    }();
    (void)wg_configured;
    const CUtensorMap xmap = hopper::bf16_tile_map(xb, M, lda, kWgBM, "cuda::linear bf16 gemm");
    const CUtensorMap wmap = hopper::bf16_tile_map(w.data, w.rows, K, kWgBN, "cuda::linear bf16 gemm");
    const dim3 grid(unsigned((N + kWgBN - 1) / kWgBN), unsigned((M + kWgBM - 1) / kWgBM), unsigned(groups));
    wg_kernel<<<grid, kWgThreads, kWgSmemBytes, stream>>>(xmap, wmap, int(M), int(N), int(K), y, int(w.rows), round);
    check_launch("cuda::linear bf16 gemm (warpgroups)");
  } else {
    mma_product<false>(xb, M, groups, w, y, round, stream);
  }
  check(cudaFreeAsync(xb, stream), "cuda::linear bf16 gemm");
}

bool usable_fp8(const Weight& w, int64_t groups) {
  const int64_t limit = int64_t(1) << 31;
  return w.format == WeightFormat::FP8 && w.data && w.scale && groups > 0 && groups < 65536 && w.rows % groups == 0 &&
         (w.rows / groups) % 32 == 0 && w.cols > 0 && w.cols % kBK == 0 && groups * w.cols < limit && w.rows < limit;
}

void linear_fp8(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, bool round, cudaStream_t stream) {
  if (!usable_fp8(w, groups) || M <= 0 || M >= (int64_t(1) << 31))
    fail("cuda::linear_fp8", "an fp8 weight with scales, groups of whole 32-row blocks, K a multiple of 64",
         std::to_string(w.rows) + "x" + std::to_string(w.cols) + " in " + std::to_string(groups) + " groups at " +
             std::to_string(M) + " rows");
  if (M <= kSwapRows) {
    launch_early("cuda::linear_fp8", swapped_kernel, unsigned(w.rows / kSwapRowsPerCta), kSwapWarps * 32, 0, stream, x,
                 int(M), groups * w.cols, w.rows / groups, w.rows, w.cols, w.data, w.scale, y, round);
    return;
  }
  keep_scratch_pool();
  if (M >= kWgRows) {
    // Prefill: the weight's bf16 values once (w.rows · K · 3 bytes moved, against the GEMM's
    // tensor-core time), then the bf16 product.
    uint16_t* wb = nullptr;
    check(cudaMallocAsync(reinterpret_cast<void**>(&wb), size_t(w.rows * w.cols) * 2, stream), "cuda::linear_fp8");
    const int64_t items = w.rows * w.cols / 8;
    widen_kernel<<<unsigned((items + 255) / 256), 256, 0, stream>>>(w.data, w.scale, w.rows, w.cols, wb);
    check_launch("cuda::linear_fp8 widen");
    linear(x, M, groups, Weight{WeightFormat::BF16, w.rows, w.cols, reinterpret_cast<const uint8_t*>(wb), nullptr}, y,
           round, stream);
    check(cudaFreeAsync(wb, stream), "cuda::linear_fp8");
    return;
  }
  const int64_t values = M * groups * w.cols;
  __nv_bfloat16* xb = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&xb), size_t(values) * sizeof(__nv_bfloat16), stream), "cuda::linear_fp8");
  to_bf16(x, values, reinterpret_cast<uint16_t*>(xb), stream);
  mma_product<true>(xb, M, groups, w, y, round, stream);
  check(cudaFreeAsync(xb, stream), "cuda::linear_fp8");
}

}  // namespace dsv41::cuda::gemm_bf16
