// The prefill GEMM of cuda::linear over fp8/fp4 weights: y[M, N] = bf16(x[M, K] · Wᵀ) on the
// tensor cores through mma.sync, with the CPU op's precision flow.
//
// Two kernels.
//
// act_quant_kernel: x (fp32) → e4m3 codes [M, K] and power-of-two scales per 32, exactly as
// qgemv's quantize_slice and the CPU's act_quant_fp8 (the same swa_fp8::block_scale of the same
// amax, one multiply by the exact reciprocal of the scale, the hardware's e4m3 rounding with
// saturation: qgemv's e4m3_round2 is this conversion followed by its decode; the test checks the
// result bit for bit). 4 threads per 32-block, 8 values each. Traffic M·K·4 read, M·K·(1 + 1/8)
// written: 8.5 µs at M = 4096, K = 1024 and 24 µs at K = 4096 on the H200.
//
// gemm_kernel, in two tilings (Cta). Wide: CTA tile 128 (M) × 128 (N) × 128 (K = four
// 32-blocks), 8 warps as 2 (M) × 4 (N), warp tile 64 × 32. Narrow, for few rows: 32 × 128 × 128,
// the 8 warps side by side along N, warp tile 32 × 16. Operands go global → shared memory by
// cp.async (16-byte chunks; wide: 3 stages at 2 CTAs/SM for fp8, 4 stages at 1 CTA/SM for fp4;
// narrow: 5 (fp8) or 6 (fp4) stages at 2 CTAs/SM; XOR-swizzled rows, so the ldmatrix and 32-bit
// fragment loads hit 32 distinct banks), then shared → registers by ldmatrix (x codes; fp8 weight
// codes) or by 32-bit loads decoded in registers (fp4 weight codes, see below).
//
// The math. mma.sync's e4m3 form (m16n8k32 .e4m3.e4m3.f32, sm_89+) is no fp8 instruction on
// sm_90: ptxas expands it to e4m3 → f16 conversions (F2FP) and two HMMA.16816.F32, plus 4 FADDs
// that add the accumulator separately (seen in the SASS; Hopper's fp8 tensor rate is reached only
// through wgmma). So the kernel issues that f16 path itself: each e4m3 fragment register is
// converted once (cvt.rn.f16x2.e4m3x2, exact: every e4m3 value is an f16), and a 32-block is two
// m16n8k16 f16 mma with fp32 accumulation, the first with a zero accumulator, the second adding
// onto it. Both operands use the same permutation of a block's 32 positions (any consistent one
// gives the same products), the one ldmatrix's byte layout yields: f16 positions 2t, 2t+1 and
// 2t+8, 2t+9 of a k16 half hold the block's values 4t..4t+3 (first half) or 16+4t..16+4t+3.
//
// Precision flow, per output and per 32-block b: D = the tensor cores' sum of the block's 32
// exact products (products of e4m3 values are exact in f16 × f16 → fp32; the sums are fp32-wide,
// truncating in alignment); then acc = fma(D, sx·sw, acc), sx the x block scale, sw the weight
// block scale, both powers of two, so D·sx·sw is exact and the fused add rounds once, as the
// CPU's acc += dot32 · s (its dot carries sx inside the quantized x, exactly). Blocks are added
// in the CPU's order (b = 0, 1, ...). So D is the one difference from the CPU, at the fp32 level:
// the tests see ≤ 0.02% of outputs one or two bf16 units apart, NMSE ≤ 2e-10.
//
// Scales per k-tile: the x scales come as [K/32, Mpad] floats with the rows of each 128-row tile
// permuted so that a thread's rows (g, g+8) of each m16 tile are 2 consecutive floats, its 8
// rows 8 (gemm.cuh scale_offset); the weight scales are read with plain loads one k-tile ahead,
// decoded to floats and stored to shared memory after the current k-tile's math (fp8: one per
// 32 × 32 block, one per warp per 32-block, folded into the row scales; fp4: one per row, a
// thread's 8 columns consecutive).
//
// fp4 weights: the fragment of B for thread (g, t) is 8 values of row g of a 32-block. A 32-bit
// shared load of the raw row gives values 8t..8t+7 (four bytes of nibbles); they are decoded to
// e4m3 codes in registers (prmt through an 8-entry table for the magnitudes, prmt's sign-replicate
// mode for the signs; 9 integer instructions per 8 values, exact: every e2m1 value is an e4m3
// value) and used at the fragment positions of values 4t..4t+3 and 16+4t..16+4t+3. The
// products of a block are summed in any order, so x's codes are stored with the same permutation
// of each block (gemm.cuh code_offset(..., fp4_order)).
//
// Cost per 32-block per warp: 32 HMMA, 48 F2FP (A once per m16 tile, B once per n8 tile), 64
// FFMA (+64 FMUL for fp4, whose scale product differs per column), 6 ldmatrix (fp8; fp4: 4
// ldmatrix, 4 32-bit loads and 36 decode ops), 5–8 scale loads. ncu (fp8, wq_b, M = 4096): 8.4
// instructions per HMMA, issue slots 59% busy, 6.6 cycles between a warp's instructions (latency
// of the LDSM → F2FP → HMMA → HMMA → FFMA chain with 4 warps per scheduler), tensor pipe 42%.
//
// Speed of light (H200: 1979 TFLOP/s dense fp8 through wgmma; the HMMA path mma.sync takes here
// tops out near 640 TFLOP/s, 42% of it giving the 270 measured; 4.8 TB/s HBM). wq_b (N = 32768,
// K = 1024) at M = 4096: 275 GFLOP; bytes W 32 MB + x codes 4 MB + y 512 MB (fp32) → 115 µs.
// Measured 1021 µs = 270 TFLOP/s (the qgemv passes of 8 rows it replaces: 47 ms). Expert w1 (fp4,
// N = 2048, K = 4096) at M = 4096: 69 GFLOP, bytes 4 + 16 + 32 MB → 11 µs plus act_quant's 24 µs;
// measured 357 µs = 192 TFLOP/s (qgemv passes: 13.2 ms). The fp8 tensor rate needs wgmma.
// CTAs are rastered in bands of 16 M-tiles (2048 rows) walking N, so a wave shares its x tiles
// and its weight tiles in L2 (94% hit rate): W is read from HBM once per band.
//
// The grouped form (cuda::moe's routed experts): the same kernel over device-made tiles of ≤ 128
// rows of one expert each (gemm.cuh Tiles), A gathered by act_quant_slots into slot order, the
// weight looked up in the expert table per CTA, the output to slot rows (up: g, u) or to the
// entries' rows (down: bf16 ye). Warps and m16 tiles past a tile's rows skip their math.
//
// Why two tilings. At decode shapes (bench-1gpu, 64 rows: 16 experts of ~24 rows) the wide tile
// leaves 6 of its 8 warps idle (their rows are past the tile's) and runs 1 CTA per SM: one busy
// warp per scheduler walks the dependent LDS → decode → F2FP → HMMA → FFMA chain of each block
// alone, ~1.4 µs per k-tile, so the weights stream at ~390 GB/s. The narrow tile puts all 8 warps
// on the columns (each a quarter of the wide warp's fragment work per block) and 2 CTAs per SM
// with 5–6 stages keep 80–100 KB of weight bytes in flight per SM, what the HBM's latency needs.
// A narrow CTA re-reads its weight tile once per 32 rows (from L2 when its neighbours in x run
// together), so for many rows the wide tile's 4× reuse wins.

#include "backend/cuda/gemm.cuh"

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/ptx.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda::gemm {

namespace {

using namespace ptx;

constexpr int kBN = 128, kBK = 128;  // CTA tile columns and depth (kBK in e4m3 bytes: four 32-blocks)
constexpr int kThreads = 256;  // 8 warps
constexpr int kGroupM = 16;    // M tiles per raster band
constexpr int kQuantThreads = 256;

static_assert(kBK == kTileK, "gemm.cuh's layout constants");

// A CTA's shape and pipeline (see the header comment). Wide: 128 rows, warps 2 (M) × 4 (N) with
// warp tiles of 64 × 32; narrow: 32 rows, warps 1 × 8 of 32 × 16.
template <WeightFormat F, Tiling T>
struct Cta {
  static constexpr bool kFp4 = F == WeightFormat::FP4, kNarrow = T == Tiling::narrow;
  static constexpr int kBM = kNarrow ? 32 : 128;
  static constexpr int kWarpsM = kNarrow ? 1 : 2, kWarpsN = 8 / kWarpsM;
  static constexpr int kMT = kBM / kWarpsM / 16;  // m16 tiles per warp
  static constexpr int kNT = kBN / kWarpsN / 8;   // n8 tiles per warp
  static constexpr int kWarpCols = 8 * kNT;
  // CTAs per SM and stages, measured on the H200: wide fp8 2 CTAs of 3 stages (wq_b at M = 4096:
  // 1021 µs against 1173 µs with 1), wide fp4 1 CTA of 4 (expert w1: 357 µs against 404 µs with 2,
  // whose 128 registers spill the fp4 decode); narrow 2 CTAs with as many stages as fit.
  static constexpr int kCtas = kNarrow || !kFp4 ? 2 : 1;
  static constexpr int kStages = kNarrow ? (kFp4 ? 6 : 5) : kFp4 ? 4 : 3;
  // Blocks of a k-tile unrolled: by 2 where registers allow (wide at 2 CTAs/SM would hoist 4
  // blocks' loads under its 128 registers and spill).
  static constexpr int kUnroll = kNarrow || kCtas == 1 ? 2 : 1;
  // Shared memory of one stage.
  static constexpr int kBRow = kFp4 ? kBK / 2 : kBK;  // bytes of one weight row in a k-tile
  static constexpr int kA = kBM * kBK;                 // x codes
  static constexpr int kB = kBN * kBRow;               // weight codes
  static constexpr int kX = 4 * kBM * 4;               // x scales [4 blocks][kBM rows] floats
  static constexpr int kW = kFp4 ? 4 * kBN * 4 : 128;  // weight scales: [4][128] or [4][4] floats
  static constexpr int kStage = kA + kB + kX + kW;
  static constexpr int kBytes = kStage * kStages;
  static_assert(kMT % 2 == 0 && kNT % 2 == 0 && kStage % 128 == 0, "tile shapes");
};

// 4 e4m3 codes → two f16x2 (codes 0, 1 and 2, 3; the lower code in the lower half), exactly.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// D = A·B + C over a 16 × 8 × 16 f16 tile (HMMA.16816.F32); zero_c: C = 0.
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}
__device__ __forceinline__ void mma_f16_acc(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// 8 e2m1 values (nibble i = value i, as stored) → e4m3 codes: lo = values 0..3, hi = 4..7, one
// byte each in order. Magnitudes through the table 0, 0.5, 1, 1.5, 2, 3, 4, 6 (e4m3 codes 0x00,
// 0x30, 0x38, 0x3C, 0x40, 0x44, 0x48, 0x4C) indexed by prmt; signs by prmt's sign-replicate mode
// from the byte whose top bit is the nibble's sign: value 2i's sign is bit 3 of byte i (the top bit
// of byte i of w << 4), value 2i+1's the top bit of byte i of w.
__device__ __forceinline__ void e2m1x8_to_e4m3(uint32_t w, uint32_t& lo, uint32_t& hi) {
  constexpr uint32_t kLut0 = 0x3C383000u, kLut1 = 0x4C484440u;
  const uint32_t mag = w & 0x77777777u, even = w << 4;
  lo = prmt(kLut0, kLut1, mag) | (prmt(even, w, 0xD9C8u) & 0x80808080u);
  hi = prmt(kLut0, kLut1, mag >> 16) | (prmt(even, w, 0xFBEAu) & 0x80808080u);
}

// ---- act_quant ----

// Where act_quant's row m comes from: x row m (dense, tiles == nullptr), or, m a slot of `tiles`,
// its entry's token row (k > 0) or x's own slot row (k = 0); -1 for a padding slot.
struct RowSource {
  const int4* tiles = nullptr;
  const int* count = nullptr;
  const int32_t* list = nullptr;
  int k = 0;
  int64_t M = 0;  // dense: rows M..Mpad-1 are padding
  __device__ int64_t row(int64_t m) const {
    if (!tiles) return m < M ? m : -1;
    const int64_t t = m / kTileRows, i = m % kTileRows;
    if (t >= *count) return -1;
    const int4 tile = tiles[t];
    if (i >= tile.z) return -1;
    return k > 0 ? list[tile.y + i] / k : m;
  }
};

// One thread: 8 consecutive values x[src, 8q..8q+7] for row m; the 4 threads of a 32-block are 4
// consecutive lanes. Padding rows write only their (zero) scales.
template <bool kFp4Order>
__global__ void __launch_bounds__(kQuantThreads) act_quant_kernel(const float* __restrict__ x, const RowSource src,
                                                                  int64_t Mpad, int64_t K, uint8_t* __restrict__ codes,
                                                                  float* __restrict__ scales) {
  const int64_t per_row = K / 8, items = Mpad * per_row;
  const int64_t i = int64_t(blockIdx.x) * kQuantThreads + threadIdx.x;
  const bool on = i < items;
  const int64_t m = on ? i / per_row : 0, q8 = on ? i % per_row : 0;
  const int64_t from = on ? src.row(m) : -1;
  const bool live = from >= 0;
  float v[8];
  const float amax = load8_block_amax(x + (live ? from : 0) * K + 8 * q8, live, v);
  if (!on) return;
  const float scale = swa_fp8::block_scale(amax), inv = 1.0f / scale;  // a power of two: inv is exact
  const int64_t b = q8 / 4;
  const int t = int(q8 % 4);
  if (t == 0) scales[scale_offset(m, b, Mpad)] = live ? scale : 0.0f;
  if (!live) return;
  uint32_t pair[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    uint16_t c;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(c) : "f"(v[2 * e + 1] * inv), "f"(v[2 * e] * inv));
    pair[e] = c;  // value 2e in the low byte
  }
  const uint32_t lo = pair[0] | pair[1] << 16, hi = pair[2] | pair[3] << 16;
  uint8_t* row = codes + m * K + 32 * b;
  if constexpr (kFp4Order) {
    *reinterpret_cast<uint32_t*>(row + 4 * t) = lo;
    *reinterpret_cast<uint32_t*>(row + 16 + 4 * t) = hi;
  } else {
    *reinterpret_cast<uint2*>(row + 8 * t) = make_uint2(lo, hi);
  }
}

void launch_act_quant(const float* x, const RowSource& src, int64_t Mpad, int64_t K, bool fp4_order, uint8_t* codes,
                      float* scales, cudaStream_t stream) {
  const int64_t items = Mpad * (K / 8);
  const unsigned grid = unsigned((items + kQuantThreads - 1) / kQuantThreads);
  if (fp4_order) act_quant_kernel<true><<<grid, kQuantThreads, 0, stream>>>(x, src, Mpad, K, codes, scales);
  else act_quant_kernel<false><<<grid, kQuantThreads, 0, stream>>>(x, src, Mpad, K, codes, scales);
  check_launch("cuda::gemm::act_quant");
}

// ---- the GEMM ----

// What one launch computes. Dense: y [M, N] = A · Wᵀ (fp32 holding bf16 values), CTA tiles
// rastered in bands. Grouped (cuda::moe): CTA x = (t · subs + sub) + tiles.max · subs · (N tile),
// z = which of `matrix`; rows sub·kBM .. of tile t's rows of A (slots t·128 ..), the weight
// table[expert].data[matrix[z]], out to slots[z] (slot order, fp32 holding bf16 values) or to the
// bf16 bits of entries' rows list[first + i].
enum class Out { Dense, Slots, Entries };
struct GemmArgs {
  const uint8_t* xq;
  const float* xs;
  int M, Mpad, N, K;
  const uint8_t* w;  // dense
  const uint8_t* wscale;
  float* y;
  Tiles tiles;  // grouped
  int subs;     // CTAs of kBM rows per tile (the wide tiling: 1)
  const ExpertPointers* table;
  int matrix[2];
  float* slots[2];
  uint16_t* entries;
};

template <WeightFormat F, Tiling T, Out kOut>
__global__ void __launch_bounds__(kThreads, Cta<F, T>::kCtas) gemm_kernel(const GemmArgs a) {
  using C = Cta<F, T>;
  constexpr bool kFp4 = C::kFp4;
  constexpr int kBM = C::kBM, kMT = C::kMT, kNT = C::kNT, kWarpCols = C::kWarpCols, kStages = C::kStages;
  extern __shared__ __align__(128) uint8_t smem[];
  const uint32_t smem0 = smem_addr(smem);
  const int tid = int(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN, g = lane / 4, t = lane % 4;

  const uint8_t* __restrict__ xq = a.xq;
  const float* __restrict__ xs = a.xs;
  const int Mpad = a.Mpad, N = a.N, K = a.K;
  // The CTA's tile: rows m0 .. m0 + rows of A (fewer than kBM at the end), columns n0 ..
  int m0, n0, rows, first = 0;
  const uint8_t* __restrict__ w;
  const uint8_t* __restrict__ wscale;
  if constexpr (kOut == Out::Dense) {
    // Raster: bands of kGroupM M tiles; within a band M fastest, then N.
    const int tiles_m = (a.M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
    const int per_band = kGroupM * tiles_n, band = int(blockIdx.x) / per_band, first_m = band * kGroupM;
    const int band_m = min(tiles_m - first_m, kGroupM), r = int(blockIdx.x) % per_band;
    m0 = (first_m + r % band_m) * kBM, n0 = r / band_m * kBN, rows = a.M - m0;
    w = a.w, wscale = a.wscale;
  } else {
    // One expert's CTAs are consecutive in x, so those that read its weight tile run together.
    const int per = int(a.tiles.max) * a.subs, i = int(blockIdx.x) % per, tt = i / a.subs, sub = i % a.subs;
    if (tt >= *a.tiles.count) return;
    const int4 tile = a.tiles.tile[tt];
    rows = tile.z - sub * kBM;
    if (rows <= 0) return;
    m0 = tt * int(kTileRows) + sub * kBM, n0 = int(blockIdx.x) / per * kBN, first = tile.y + sub * kBM;
    const int matrix = blockIdx.z == 0 ? a.matrix[0] : a.matrix[1];
    w = a.table[tile.x].data[matrix], wscale = a.table[tile.x].scale[matrix];
  }
  const int KT = K / kBK, kblocks = K / 32;
  // Warps whose rows are all past the tile's rows skip the math (a decode's tiles are short).
  const bool busy = wm * 16 * kMT < rows;

  // This thread's cp.async sources and destinations (offsets within a stage). Rows past M or N
  // are zero-filled (their source, clamped to the first row, is not read).
  // A: chunks tid + 256q, q < kBM/32: row tid/8 + 32q, chunk tid%8 (16 bytes of K).
  constexpr int kAq = kBM / 32;
  const int a_row = tid / 8, a_chunk = tid % 8;
  const uint32_t a_dst = uint32_t(a_row * kBK + ((a_chunk ^ (a_row & 7)) << 4));
  const uint32_t a_src = uint32_t(m0 + a_row) * uint32_t(K) + a_chunk * 16;  // usable(): M·K < 2^31
  // B: fp8 as A over the weight rows; fp4 rows of 64 bytes: chunks tid + 256q, q < 2: row tid/4 +
  // 64q, chunk tid%4, swizzled by (row / 2) % 4.
  constexpr int kBq = kFp4 ? 2 : 4, kBStep = kFp4 ? 64 : 32, kBRowBytes = kFp4 ? 64 : kBK;
  const int b_row = kFp4 ? tid / 4 : tid / 8, b_chunk = kFp4 ? tid % 4 : tid % 8;
  const uint32_t b_dst = kFp4 ? uint32_t(b_row * 64 + ((b_chunk ^ ((b_row >> 1) & 3)) << 4))
                              : uint32_t(b_row * kBK + ((b_chunk ^ (b_row & 7)) << 4));
  const uint32_t w_stride = kFp4 ? K / 2 : K;
  const uint32_t b_src = uint32_t(n0 + b_row) * w_stride + b_chunk * 16;  // usable(): N·K < 2^31
  // x scales (kBM consecutive floats per block, gemm.cuh scale_offset): threads < kBM, block
  // tid / (kBM/4), 16 bytes tid % (kBM/4).
  const uint32_t x_src = uint32_t(tid / (kBM / 4) % 4) * uint32_t(Mpad) + m0 + (tid % (kBM / 4)) * 4;
  const uint32_t x_dst = uint32_t(C::kA + C::kB + (tid % kBM) * 16);

  auto load_tiles = [&](int stage, int kt) {
    const uint32_t base = smem0 + uint32_t(stage * C::kStage);
    const uint32_t k0 = uint32_t(kt) * kBK;
#pragma unroll
    for (int q = 0; q < kAq; ++q) {
      const bool ok = a_row + 32 * q < rows;
      cp_async16(base + a_dst + q * 32 * kBK, xq + (ok ? a_src + uint32_t(32 * q * K) + k0 : 0u), ok);
    }
#pragma unroll
    for (int q = 0; q < kBq; ++q) {
      const bool ok = n0 + b_row + kBStep * q < N;
      cp_async16(base + uint32_t(C::kA) + b_dst + q * kBStep * kBRowBytes,
                 w + (ok ? b_src + uint32_t(kBStep * q) * w_stride + k0 * kBRowBytes / kBK : 0u), ok);
    }
    if (tid < kBM) cp_async16(base + x_dst, xs + (x_src + uint32_t(kt) * 4 * uint32_t(Mpad)), true);
  };

  // Weight scales of k-tile kt: read into registers (before the current tile's math), decoded and
  // stored after it. fp8: threads < 16, 32-row group tid/4, block tid%4; fp4: 2 per thread, row
  // e/4 and block e%4 of e = tid + 256q, stored at the row's permuted column.
  constexpr int kWq = kFp4 ? 2 : 1;
  uint8_t w_code[kWq];
  auto fetch_scales = [&](int kt) {
#pragma unroll
    for (int q = 0; q < kWq; ++q) {
      w_code[q] = 0;
      if constexpr (kFp4) {
        const int e = tid + 256 * q, n = n0 + e / 4;
        if (n < N) w_code[q] = __ldg(wscale + int64_t(n) * kblocks + kt * 4 + e % 4);
      } else {
        const int n = n0 + (tid / 4) * 32;
        if (tid < 16 && n < N) w_code[q] = __ldg(wscale + int64_t(n / 32) * kblocks + kt * 4 + tid % 4);
      }
    }
  };
  auto store_scales = [&](int stage) {
    float* ws = reinterpret_cast<float*>(smem + stage * C::kStage + C::kA + C::kB + C::kX);
#pragma unroll
    for (int q = 0; q < kWq; ++q) {
      if constexpr (kFp4) {
        // Column nl at (warp, t, nt, j) so that a thread's 2·kNT scales are consecutive.
        const int e = tid + 256 * q, nl = e / 4, blk = e % 4;
        const int col = nl / kWarpCols * kWarpCols + (nl % 8 / 2) * 2 * kNT + (nl % kWarpCols / 8) * 2 + nl % 2;
        ws[blk * kBN + col] = n0 + nl < N ? e8m0_to_float(w_code[q]) : 0.0f;
      } else if (tid < 16) {
        ws[(tid % 4) * 4 + tid / 4] = n0 + (tid / 4) * 32 < N ? e8m0_to_float(w_code[q]) : 0.0f;
      }
    }
  };

  float acc[kMT][kNT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) {
      load_tiles(s, s);
      fetch_scales(s);
      store_scales(s);
    }
    cp_async_commit();
  }

  // Fragment addresses within a stage. A (ldmatrix.x4 of a 16 × 32 block): lane l gives row
  // (l%8) + 8·((l/8)%2) of the m16 tile, chunk 2b + l/16. fp8 B (x4 over two n8 tiles): row
  // (l%8) + 8·(l/16), chunk 2b + (l/8)%2.
  const int a_frag_row = wm * 16 * kMT + (lane % 8) + 8 * ((lane / 8) % 2), a_frag_half = lane / 16;
  const int b_frag_row = wn * kWarpCols + (lane % 8) + 8 * (lane / 16), b_frag_half = (lane / 8) % 2;

  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < KT) {
      load_tiles(next % kStages, next);
      fetch_scales(next);
    }
    cp_async_commit();

    const uint32_t base = smem0 + uint32_t((kt % kStages) * C::kStage);
    const uint32_t sA = base, sB = base + C::kA, sX = base + C::kA + C::kB, sW = sX + C::kX;
#pragma unroll(C::kUnroll)
    for (int blk = 0; blk < (busy ? 4 : 0); ++blk) {
      uint32_t bf[kNT][2];
      if constexpr (kFp4) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const int n = wn * kWarpCols + nt * 8 + g;
          const uint32_t v = lds32(sB + uint32_t(n * 64 + ((blk ^ ((n >> 1) & 3)) << 4) + 4 * t));
          e2m1x8_to_e4m3(v, bf[nt][0], bf[nt][1]);
        }
      } else {
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          const int n = b_frag_row + np * 16, c = 2 * blk + b_frag_half;
          uint32_t r4[4];
          ldmatrix_x4(r4, sB + uint32_t(n * kBK + ((c ^ (n & 7)) << 4)));
          bf[2 * np][0] = r4[0], bf[2 * np][1] = r4[1], bf[2 * np + 1][0] = r4[2], bf[2 * np + 1][1] = r4[3];
        }
      }
      // Weight scales: fp4 those of columns nt·8 + 2t + j at [2nt + j]; fp8 one for the warp's
      // columns (one 32-row group), folded into the row scales below (exactly: powers of two).
      float sw[2 * kNT];
      if constexpr (kFp4) {
        const uint32_t p = sW + uint32_t((blk * kBN + wn * kWarpCols + t * 2 * kNT) * 4);
#pragma unroll
        for (int i = 0; i < kNT / 2; ++i) {
          const float4 u = lds128f(p + 16 * i);
          sw[4 * i] = u.x, sw[4 * i + 1] = u.y, sw[4 * i + 2] = u.z, sw[4 * i + 3] = u.w;
        }
      } else {
        sw[0] = lds32f(sW + uint32_t((blk * 4 + wn * kWarpCols / 32) * 4));
      }
      // The x scales of rows mt·16 + g and mt·16 + 8 + g: [mt/2 · 32 + g·4 + (mt%2)·2 + h].
      const uint32_t sx_row = sX + uint32_t((blk * kBM + wm * 16 * kMT + g * 4) * 4);
      // The B fragments as f16: [nt][0..1] the first k16 half of the block's (permuted) positions,
      // [nt][2..3] the second (see the header comment).
      uint32_t bh[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        e4m3x4_to_f16(bf[nt][0], bh[nt][0], bh[nt][1]);
        e4m3x4_to_f16(bf[nt][1], bh[nt][2], bh[nt][3]);
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        if (wm * 16 * kMT + mt * 16 >= rows) continue;
        uint32_t af[4];
        const int row = a_frag_row + mt * 16, c = 2 * blk + a_frag_half;
        ldmatrix_x4(af, sA + uint32_t(row * kBK + ((c ^ (row & 7)) << 4)));
        uint32_t a1[4], a2[4];  // the two k16 halves as f16 fragments
        e4m3x4_to_f16(af[0], a1[0], a1[2]);
        e4m3x4_to_f16(af[1], a1[1], a1[3]);
        e4m3x4_to_f16(af[2], a2[0], a2[2]);
        e4m3x4_to_f16(af[3], a2[1], a2[3]);
        float2 sx = lds64f(sx_row + uint32_t((mt / 2 * 32 + mt % 2 * 2) * 4));
        if constexpr (!kFp4) sx.x *= sw[0], sx.y *= sw[0];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          float d[4];
          mma_f16(d, a1, bh[nt][0], bh[nt][1]);
          mma_f16_acc(d, a2, bh[nt][2], bh[nt][3]);
          if constexpr (kFp4) {
            const float wx = sw[2 * nt], wy = sw[2 * nt + 1];
            acc[mt][nt][0] = fmaf(d[0], sx.x * wx, acc[mt][nt][0]);
            acc[mt][nt][1] = fmaf(d[1], sx.x * wy, acc[mt][nt][1]);
            acc[mt][nt][2] = fmaf(d[2], sx.y * wx, acc[mt][nt][2]);
            acc[mt][nt][3] = fmaf(d[3], sx.y * wy, acc[mt][nt][3]);
          } else {
            acc[mt][nt][0] = fmaf(d[0], sx.x, acc[mt][nt][0]);
            acc[mt][nt][1] = fmaf(d[1], sx.x, acc[mt][nt][1]);
            acc[mt][nt][2] = fmaf(d[2], sx.y, acc[mt][nt][2]);
            acc[mt][nt][3] = fmaf(d[3], sx.y, acc[mt][nt][3]);
          }
        }
      }
    }
    // The scales of k-tile `next` into its stage, last read at k-tile kt - 1 (all threads are past
    // this iteration's barrier); read at k-tile `next`, after at least one more barrier.
    if (next < KT) store_scales(next % kStages);
  }
  cp_async_wait<0>();

  // y: row mt·16 + h·8 + g, columns nt·8 + 2t, +1 of the warp tile; values [2h], [2h + 1].
  const bool pairs = N % 2 == 0;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = wm * 16 * kMT + mt * 16 + h * 8 + g;  // within the tile
      if (m >= rows) continue;
      if constexpr (kOut == Out::Entries) {  // grouped_usable: N even
        uint16_t* yr = a.entries + int64_t(a.tiles.list[first + m]) * N;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const int n = n0 + wn * kWarpCols + nt * 8 + 2 * t;
          const uint32_t v = uint32_t(bf16_from_float(acc[mt][nt][2 * h])) |
                             uint32_t(bf16_from_float(acc[mt][nt][2 * h + 1])) << 16;
          if (n < N) *reinterpret_cast<uint32_t*>(yr + n) = v;
        }
        continue;
      }
      float* yr = (kOut == Out::Dense ? a.y : blockIdx.z == 0 ? a.slots[0] : a.slots[1]) + int64_t(m0 + m) * N;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int n = n0 + wn * kWarpCols + nt * 8 + 2 * t;
        const float v0 = round_bf16(acc[mt][nt][2 * h]), v1 = round_bf16(acc[mt][nt][2 * h + 1]);
        if (pairs && n + 1 < N) {
          *reinterpret_cast<float2*>(yr + n) = make_float2(v0, v1);
        } else {
          if (n < N) yr[n] = v0;
          if (n + 1 < N) yr[n + 1] = v1;
        }
      }
    }
}

template <WeightFormat F, Tiling T, Out kOut>
void launch_gemm(const GemmArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr int kBytes = Cta<F, T>::kBytes;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(gemm_kernel<F, T, kOut>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes),
          "cuda::linear gemm");
    return true;
  }();
  (void)configured;
  gemm_kernel<F, T, kOut><<<grid, kThreads, kBytes, stream>>>(a);
  check_launch("cuda::linear gemm");
}

template <Out kOut>
void launch_for(WeightFormat f, Tiling tiling, const GemmArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr WeightFormat fp4 = WeightFormat::FP4, fp8 = WeightFormat::FP8;
  const bool narrow = tiling == Tiling::narrow;
  if (f == fp4) narrow ? launch_gemm<fp4, Tiling::narrow, kOut>(a, grid, stream) : launch_gemm<fp4, Tiling::wide, kOut>(a, grid, stream);
  else narrow ? launch_gemm<fp8, Tiling::narrow, kOut>(a, grid, stream) : launch_gemm<fp8, Tiling::wide, kOut>(a, grid, stream);
}

int rows_of(Tiling tiling) { return tiling == Tiling::narrow ? Cta<WeightFormat::FP4, Tiling::narrow>::kBM : int(kTileRows); }

// A grouped launch: its CTAs of `rows_of(tiling)` rows, enough for tiles of tiles.most rows, for
// every possible tile of every N tile, `matrices` along z.
template <Out kOut>
void launch_grouped(WeightFormat f, Tiling tiling, GemmArgs& a, int64_t N, int matrices, cudaStream_t stream) {
  if (tiling == Tiling::automatic) fail("cuda::gemm grouped", "a wide or narrow tiling", "automatic");
  const int rows = rows_of(tiling);
  a.subs = int((std::min<int64_t>(a.tiles.most, kTileRows) + rows - 1) / rows);
  const dim3 grid{unsigned(a.tiles.max * a.subs * ((N + kBN - 1) / kBN)), 1u, unsigned(matrices)};
  launch_for<kOut>(f, tiling, a, grid, stream);
}

}  // namespace

bool usable(int64_t M, const Weight& w) {
  // 32-bit offsets into x's codes and scales and into the weight (bytes): each under 2^31.
  const int64_t limit = int64_t(1) << 31;
  return w.quantized() && M >= kMinRows && w.cols % kTileK == 0 && w.cols > 0 && w.rows > 0 &&
         M * w.cols < limit && w.rows * w.cols < limit && w.scale != nullptr;
}

void act_quant(const float* x, int64_t M, int64_t K, bool fp4_order, uint8_t* codes, float* scales,
               cudaStream_t stream) {
  if (M <= 0) return;
  if (K % 32 != 0) fail("cuda::gemm::act_quant", "K a multiple of 32", "K = " + std::to_string(K));
  RowSource src;
  src.M = M;
  launch_act_quant(x, src, padded_rows(M), K, fp4_order, codes, scales, stream);
}

Tiling dense_tiling(int64_t M, int64_t N) {
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cuda::linear gemm");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cuda::linear gemm");
  const int64_t wide_tiles = (M + kTileRows - 1) / kTileRows * ((N + kBN - 1) / kBN);
  // Measured (docs/benchmarks.md, BM_GemmTiling): with a wide tile per SM or more the wide tiling
  // wins (narrow re-reads each weight tile once per 32 rows); below it narrow wins 1.4-2x.
  return wide_tiles < int64_t(sms) ? Tiling::narrow : Tiling::wide;
}

void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream, Tiling tiling) {
  if (!usable(M, w)) fail("cuda::linear gemm", "an fp8/fp4 weight, M >= 64, K % 128 == 0", "another shape");
  const int64_t K = w.cols, Mpad = padded_rows(M);
  const bool fp4 = w.format == WeightFormat::FP4;
  if (tiling == Tiling::automatic) tiling = dense_tiling(M, w.rows);
  keep_scratch_pool();
  const size_t code_bytes = size_t(M * K), scale_bytes = size_t(K / 32 * Mpad) * sizeof(float);
  uint8_t* scratch = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), code_bytes + scale_bytes, stream), "cuda::linear gemm");
  uint8_t* codes = scratch;
  float* scales = reinterpret_cast<float*>(scratch + code_bytes);  // code_bytes: a multiple of 128
  act_quant(x, M, K, fp4, codes, scales, stream);
  GemmArgs a{};
  a.xq = codes, a.xs = scales, a.M = int(M), a.Mpad = int(Mpad), a.N = int(w.rows), a.K = int(K);
  a.w = w.data, a.wscale = w.scale, a.y = y;
  const int rows = rows_of(tiling);
  const int64_t tiles = (M + rows - 1) / rows * ((w.rows + kBN - 1) / kBN);
  launch_for<Out::Dense>(w.format, tiling, a, dim3{unsigned(tiles)}, stream);
  check(cudaFreeAsync(scratch, stream), "cuda::linear gemm");
}

bool grouped_usable(WeightFormat up, WeightFormat down, int64_t dim, int64_t inter, int64_t max_tiles) {
  const auto quantized = [](WeightFormat f) { return f == WeightFormat::FP4 || f == WeightFormat::FP8; };
  const int64_t limit = int64_t(1) << 31, slots = max_tiles * kTileRows;
  return quantized(up) && quantized(down) && dim > 0 && inter > 0 && dim % kTileK == 0 && inter % kTileK == 0 &&
         max_tiles > 0 && slots * std::max(dim, inter) < limit && dim * inter < limit &&
         max_tiles * ((std::max(dim, inter) + kBN - 1) / kBN) < limit;
}

void act_quant_slots(const float* x, int64_t K, const Tiles& tiles, int k, bool fp4_order, uint8_t* codes,
                     float* scales, cudaStream_t stream) {
  if (K % 32 != 0) fail("cuda::gemm::act_quant_slots", "K a multiple of 32", "K = " + std::to_string(K));
  RowSource src;
  src.tiles = tiles.tile, src.count = tiles.count, src.list = tiles.list, src.k = k;
  launch_act_quant(x, src, tiles.slots(), K, fp4_order, codes, scales, stream);
}

void grouped_up(const uint8_t* codes, const float* scales, const Tiles& tiles, const ExpertPointers* table,
                WeightFormat format, Tiling tiling, int64_t dim, int64_t inter, float* g, float* u, cudaStream_t stream) {
  GemmArgs a{};
  a.xq = codes, a.xs = scales, a.Mpad = int(tiles.slots()), a.N = int(inter), a.K = int(dim);
  a.tiles = tiles, a.table = table, a.matrix[0] = 0, a.matrix[1] = 2, a.slots[0] = g, a.slots[1] = u;
  launch_grouped<Out::Slots>(format, tiling, a, inter, 2, stream);
}

void grouped_down(const uint8_t* codes, const float* scales, const Tiles& tiles, const ExpertPointers* table,
                  WeightFormat format, Tiling tiling, int64_t inter, int64_t dim, uint16_t* ye, cudaStream_t stream) {
  GemmArgs a{};
  a.xq = codes, a.xs = scales, a.Mpad = int(tiles.slots()), a.N = int(dim), a.K = int(inter);
  a.tiles = tiles, a.table = table, a.matrix[0] = a.matrix[1] = 1, a.entries = ye;
  launch_grouped<Out::Entries>(format, tiling, a, dim, 1, stream);
}

}  // namespace dsv41::cuda::gemm
