// The GEMM of cuda::linear over fp8/fp4 weights: y[M, N] = bf16(x[M, K] · Wᵀ) on Hopper's
// warpgroup MMA (wgmma), with the CPU op's precision flow.
//
// The operands. The reference multiplies act_quant(x) (e4m3 codes with a power-of-two scale per
// 32 values) by the weight's codes (e4m3 with a ue8m0 scale per 32 × 32 block, or e2m1 with one
// per 32 along a row), summing each block's products and scaling them. Both scaled values x_q·s
// and w_q·s are exact in bf16 (at most 4 significant bits, the scales powers of two), and so are
// their products in fp32: a bf16 MMA with fp32 accumulation over the whole of K computes the same
// sum of the same exact products, in another order. So the kernel multiplies bf16 operands that
// are those exact values: act_quant writes x_q·s (one kernel, before the GEMM), and the weights
// are widened to w_q·s in registers as they are used. One MMA per k16 step and no per-block
// promotion of partial sums; bf16 runs at half the fp8 tensor rate, which a per-32 promotion of
// fp8 partials (a multiply-add per accumulator per k32 step, as many as the MMA's own cycles)
// would cost anyway (docs/decisions.md).
//
// The math: wgmma m64nNk16, A = 64 weight rows in registers (each warp 16), B = N activation rows
// in shared memory (K-major, swizzled 128B, as the tensor copy engine writes them), D = fp32
// [64 weight rows, N activation rows] in registers. A's fragment for a k16 step: thread (g, t)
// gives rows g and g+8 of its warp's 16 at columns 2t, 2t+1, 2t+8, 2t+9. The k-tile's 128
// positions are permuted (gemm.cuh value_offset, the same order in x's rows) so that those four
// are values 4j..4j+3 of 32-block t of the row, paired as (4j, 4j+2) and (4j+1, 4j+3): a thread
// reads its rows' whole block t (16 bytes of e2m1, 32 of e4m3) once per k-tile, with one scale per
// row, and widens 4 values per row per step. Each fragment register's two values are the codes at
// the same place in two bytes, so one prmt (sign-replicating), one shift and one mask make them
// bf16 by moving bits (dequant.cuh: the value times 2^-120 for e4m3, 2^-126 for e2m1), and one
// bf16 multiply by the row's 2^e with that power folded in gives w_q·s, exactly: 2 instructions a
// value, where conversions through f16 and f32 (e4m3) or a byte table (e2m1) took 2.5 and 3.5.
//
// The CTA: 3 warpgroups. The producer (one, 56 registers a thread) fills a ring of stages, each
// one k-tile of 128: the activation rows by the tensor copy engine (two boxes of [BN rows, 64],
// swizzled 128B; rows past the end arrive as zeros), the weight rows and their scale bytes by
// cp.async (16 and 4 bytes), a stage's barrier completing when both have landed. The two
// consumers (224 registers) each own 64·MSub weight rows: per k-tile they read their rows' codes
// and scales from the stage into registers, then for each of the 8 k16 steps widen the A
// fragments (in 2 or 4 buffers: a step's registers are rewritten only once the MMA that last read
// them completed) and issue MSub MMAs, one commit group per step with 2 buffers or per two steps
// with 4 (the narrow tiles: their short MMAs leave the wait, fence and commit a large share of the
// issue slots); a stage goes back to the producer once all of its MMAs have completed, a few steps
// into the next k-tile.
//
// Tilings (gemm.cuh): wide, MSub = 2 and BN = 128 (256 weight rows × 128 activation rows, 4 fp4
// or 3 fp8 stages of 48-64 KB); narrow, MSub = 1 and BN = 16, 32, 48 or 64, up to 12 stages so that
// the weights' bytes in flight cover the memory's latency when the MMAs are few (decode). The
// narrow BN ≤ 48 forms run two CTAs an SM (≤ 100 KB of stages each, 80 registers a thread).
//
// Split-K (dense, automatic tiling only): when the output tiles would leave most SMs idle (a
// decode batch's small weights: wkv 4 tiles, the shared expert's w1 18), K is cut into ranges of
// at least 2 k-tiles so that the CTAs fill the SMs once; each range's fp32 sums go to a partial
// buffer and rows.h sum_splits adds them in a fixed order, then rounds.
//
// By groups (linear_groups: wo_a between the swapped GEMV's rows and prefill's): the dense form for
// each group of the weight's rows in one launch (grid z, Out::Groups), each group's columns of A its
// own, narrow tiles alone; x's bf16 values as they are, not act-quantized (PlainRowSource: the
// same permuted places), which the reference multiplies by wo_a's bf16 dequantization.
//
// The grouped form (cuda::moe's routed experts): the same kernel over device-made tiles of ≤ 128
// rows of one expert each (gemm.cuh Tiles), the activations gathered by act_quant_slots into slot
// order, the weight looked up in the expert table per CTA and read in gemm.cuh's tile layout (a
// stage's 128 rows one contiguous run), the output to slot rows (up: g, u) or to the entries' rows
// (down: bf16 ye).
//
// Speed of light (H200: ~990 TFLOP/s dense bf16 by the datasheet, ~790 measured; 4.8 TB/s HBM,
// ~4.3 measured copy): expert w1 (fp4, 2048 × 4096) at M = 4096: 69 GFLOP → 87 µs at 790; wq_b
// (fp8, 32768 × 1024) at M = 4096: 275 GFLOP → 350 µs; at decode sizes the weights' bytes bound it
// (expert w1: 4.2 MB → 1 µs). bench/cuda/kernels_bench.cu measures both against cuBLASLt.
// Measured on the H200 (1c934af, docs/benchmarks.md): expert w1 at M = 4096, the kernel alone
// 129 µs (535 TFLOP/s, Nsight Compute; tensor pipe ~56% busy), with act_quant 163 µs (423
// TFLOP/s) against cuBLASLt's bf16 GEMM 108 µs (638 TFLOP/s) on bf16 operands it need not widen;
// wq_b 409 and wo_b 498 TFLOP/s (cuBLASLt 558, 640). The narrow tiling is issue-bound (~0.4 µs
// per k-tile per CTA, 0.54 instructions per cycle per scheduler): ~20 GB/s of weights per SM, so
// decode needs most SMs busy (the MoE's grouped launches are; a lone small weight is not). ptxas
// gives the kernel 168 registers a thread whatever setmaxnreg grants the consumers, so the wide
// fp8 forms spill 8 (dense) to 88 (grouped) bytes and the wide form keeps two fragment buffers.
// At decode (cuda::moe, 16 experts × 64 rows, Nsight Compute) the narrow form is bound by its
// consumers: the producer waits on free stages, ~40 instructions a wgmma (8 weight values a
// thread), 16 of them widening since the bit moves (eb51091: 3-5% faster for fp4, 1-2% for fp8)
// and the rest per-step bookkeeping (descriptor, wait, fence, commit, branches; commit groups of
// two steps took 0.3–2.5% off, docs/benchmarks.md).

#include "backend/cuda/gemm.cuh"

#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/rows.h"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/wgmma.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda::gemm {

namespace {

using namespace ptx;
using namespace hopper;

constexpr int kBK = 128;          // k-tile: four 32-blocks
constexpr int kConsumers = 2;     // consumer warpgroups
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // 128·56 + 256·224 ≤ 64K registers
constexpr int kSmemBudget = 210 * 1024;                  // one CTA an SM
constexpr int kSmemBudgetPair = 100 * 1024;              // two CTAs an SM (≤ 113 KB each)
constexpr int kQuantThreads = 256;
constexpr int kMinSplitTiles = 2;  // k-tiles per split of K, at least (a split's pipeline fills)

static_assert(kBK == kTileK, "gemm.cuh's layout constants");

// A CTA's shape and its stage of shared memory: [x panel 0 | x panel 1 | weight rows | scales].
// The small narrow tiles (BN ≤ 48: decode) run two CTAs an SM, at the launch's 80 registers a
// thread (no setmaxnreg): twice the warps to hide the widening's latency, and half the waves.
template <WeightFormat F, int BN, int MSub>
struct Cta {
  static constexpr int kPerSm = MSub == 1 && BN <= 48 ? 2 : 1;
  static constexpr bool kFp4 = F == WeightFormat::FP4;
  static constexpr int kBM = 64 * MSub * kConsumers;    // weight rows
  static constexpr int kRowBytes = kFp4 ? 64 : 128;     // one weight row of a k-tile
  static constexpr int kPanel = BN * 128;               // [BN rows][64 bf16]
  static constexpr int kX = 2 * kPanel;
  static constexpr int kW = kBM * kRowBytes;
  static constexpr int kS = kFp4 ? kBM * 4 : kBM / 32 * 4;  // fp4 [kBM][4] bytes; fp8 [kBM/32][4]
  static constexpr int kStage = (kX + kW + kS + 1023) / 1024 * 1024;
  static constexpr int kBudget = kPerSm == 2 ? kSmemBudgetPair : kSmemBudget;
  static constexpr int kStages = kBudget / kStage < 12 ? kBudget / kStage : 12;
  static constexpr int kBytes = kStages * kStage + 2 * kStages * 8 + 1024;  // + barriers, + alignment
  static_assert(kStages >= 2 && kPanel % 1024 == 0, "tile shapes");
};

// ---- widening the weights ----

// A thread's weights of one k-tile: rows g and g+8 of each of its MSub sub-tiles, 32-block t.
// Widened by moving bits (dequant.cuh): each code becomes its value times 2^-120 (e4m3) or 2^-126
// (e2m1), and one bf16 multiply by the row's scale with that power of two folded in gives w_q·s.
// A k-tile whose warpgroup holds a scale of 2 or more (kRare: never in a trained checkpoint, whose
// scales are near 2^-8) multiplies by the power of two first, then by 2^(e-127).
template <bool kFp4, int MSub>
struct Rows {
  static constexpr int kWords = kFp4 ? 4 : 8;  // 16 bytes of e2m1 or 32 of e4m3
  uint32_t w[MSub][2][kWords];
  uint32_t scale[MSub][2];  // bf16x2: folded_scale_bf16x2(e), or pow2_bf16x2(e) when kRare

  // The A fragment of k16 step J for sub-tile s (gemm.cuh value_offset: values 4J, 4J+2 at
  // columns 2t, 2t+1 and 4J+1, 4J+3 at 2t+8, 2t+9, of block t). fp8: word J's bytes 0, 2 and 1, 3.
  // fp4: word J/2's bytes 2(J%2) and 2(J%2)+1, their low nibbles then their high ones.
  template <int J, bool kRare>
  __device__ __forceinline__ void fragment(int s, uint32_t (&a)[4]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t lo, hi;
      if constexpr (kFp4) {
        constexpr int b = 2 * (J % 2);
        lo = e2m1x2_bits<b, b + 1>(w[s][h][J / 2] << 4);
        hi = e2m1x2_bits<b, b + 1>(w[s][h][J / 2]);
      } else {
        lo = e4m3x2_bits<0, 2>(w[s][h][J]);
        hi = e4m3x2_bits<1, 3>(w[s][h][J]);
      }
      if constexpr (kRare) {
        constexpr uint32_t unbias = kFp4 ? kE2m1Bits : kE4m3Bits;
        lo = mul_bf16x2(lo, unbias), hi = mul_bf16x2(hi, unbias);
      }
      a[h] = mul_bf16x2(lo, scale[s][h]);      // a0 (row g), a1 (row g+8): columns 2t, 2t+1
      a[2 + h] = mul_bf16x2(hi, scale[s][h]);  // a2, a3: columns 2t+8, 2t+9
    }
  }
};

// ---- act_quant ----

// Where act_quant's row m comes from and goes: x row m to xq row m (dense, slot == nullptr), or,
// m a list position of cuda::moe's entries, its entry's token row to its slot; from = -1 past the
// live entries. PlainRowSource: x's bf16 values as they are, not quantized (linear_groups'
// `quantize` false: wo_a), into the same permuted places.
struct RowSource {
  static constexpr bool kQuantize = true;
  const float* x = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* list = nullptr;
  int k = 0;
  __device__ void row(int64_t m, int64_t& from, int64_t& to) const {
    if (!slot) {
      from = to = m;
      return;
    }
    to = slot[m];
    from = to < 0 ? -1 : list[m] / k;
  }
  __device__ void load8(int64_t, int64_t from, int64_t k0, int64_t K, float (&v)[8]) const {
    const float4 a = *reinterpret_cast<const float4*>(x + from * K + k0);
    const float4 b = *reinterpret_cast<const float4*>(x + from * K + k0 + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
};

struct PlainRowSource : RowSource {
  static constexpr bool kQuantize = false;
};

// The hidden values of cuda::moe's entries, formed as they are read: list position m's slot row of
// g and u (the up GEMM's outputs) through the SwiGLU with its entry's routing weight.
struct SwigluSource {
  static constexpr bool kQuantize = true;
  const float *g, *u;
  const int32_t *slot, *list;
  const float* weights;
  float limit;
  __device__ void row(int64_t m, int64_t& from, int64_t& to) const { from = to = slot[m]; }
  __device__ void load8(int64_t m, int64_t from, int64_t k0, int64_t K, float (&v)[8]) const {
    const float* gr = g + from * K + k0;
    const float* ur = u + from * K + k0;
    const float* w = weights + list[m];
#pragma unroll
    for (int e = 0; e < 8; e += 4) {
      const float4 a = *reinterpret_cast<const float4*>(gr + e), b = *reinterpret_cast<const float4*>(ur + e);
      v[e] = swiglu(a.x, b.x, limit, w), v[e + 1] = swiglu(a.y, b.y, limit, w);
      v[e + 2] = swiglu(a.z, b.z, limit, w), v[e + 3] = swiglu(a.w, b.w, limit, w);
    }
  }
};

// One thread: 8 consecutive values of row m from its source (positions 8q..8q+7); the 4 threads of
// a 32-block are 4 consecutive lanes. The scale is swa_fp8::block_scale of the block's amax, x/s is
// rounded to e4m3 by the hardware (saturating), as qgemv's quantize_slice and the CPU's
// act_quant_fp8; the value code·s goes out as bf16 (exact), value_offset's pairs of consecutive
// positions in one store. Traffic: the source's bytes once (x: K·4 a row; g, u: 2·K·4), K·2 out.
template <class Source>
__global__ void __launch_bounds__(kQuantThreads) act_quant_kernel(const Source src, int64_t rows, int64_t K,
                                                                  uint16_t* __restrict__ xq) {
  wait_for_inputs();
  const int64_t per_row = K / 8, items = rows * per_row;
  const int64_t i = int64_t(blockIdx.x) * kQuantThreads + threadIdx.x;
  const bool on = i < items;
  const int64_t m = on ? i / per_row : 0, q8 = on ? i % per_row : 0;
  int64_t from = -1, to = 0;
  if (on) src.row(m, from, to);
  const bool live = from >= 0;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (live) src.load8(m, from, 8 * q8, K, v);
  uint32_t b[8];
  if constexpr (Source::kQuantize) {
    const float amax = block_amax8(v);
    if (!live) return;
    const float scale = swa_fp8::block_scale(amax), inv = 1.0f / scale;  // a power of two: inv is exact
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
      const float2 r = e4m3_round2(v[e] * inv, v[e + 1] * inv);
      b[e] = bf16_from_float(r.x * scale), b[e + 1] = bf16_from_float(r.y * scale);
    }
  } else {
    if (!live) return;
#pragma unroll
    for (int e = 0; e < 8; ++e) b[e] = bf16_from_float(v[e]);  // bf16 values already: exact
  }
  const int64_t k0 = 8 * q8;
  // Values e and e + 2 (e % 4 < 2) sit in two consecutive slots.
#pragma unroll
  for (int e : {0, 1, 4, 5}) *reinterpret_cast<uint32_t*>(xq + value_offset(to, k0 + e, K)) = b[e] | b[e + 2] << 16;
}

template <class Source>
void launch_act_quant(const Source& src, int64_t rows, int64_t K, uint16_t* xq, cudaStream_t stream) {
  const int64_t items = rows * (K / 8);
  launch_early("cuda::gemm::act_quant", act_quant_kernel<Source>, unsigned((items + kQuantThreads - 1) / kQuantThreads),
               kQuantThreads, 0, stream, src, rows, K, xq);
}

// ---- the GEMM ----

// What one launch computes. Dense: y [M, N] = A · Wᵀ (fp32 holding bf16 values), CTA x = (row
// tile, column tile) with the row tiles fastest, y = the split of K (k-tiles y·per .. of K/128):
// with more than one split (split_k, rows.h) each writes its fp32 sums to partial [splits, M, N]
// unrounded, and sum_splits finishes y. Groups (linear_groups): Dense by groups, z the group, whose
// A columns are z·K .., weight rows z·N .. and y columns z·N .. of rows gridDim.z·N long (a form of
// its own: the offsets cost the producer registers it does not have to spare in the wide tile). Grouped (cuda::moe): CTA x = (t · subs + sub) +
// tiles.max · subs · (N tile), z = which of `matrix`; rows sub·BN .. of tile t's rows of A (slots
// t·128 ..), the weight table[expert].data[matrix[z]], out to slots[z] (slot order, fp32 holding
// bf16 values) or to the bf16 bits of entries' rows list[first + i].
enum class Out { Dense, Groups, Slots, Entries };
struct GemmArgs {
  int M, N, K;
  const uint8_t* w;  // dense
  const uint8_t* wscale;
  float* y;
  Tiles tiles;  // grouped
  int subs;     // CTAs of BN rows per tile
  const ExpertPointers* table;
  int matrix[2];
  float* slots[2];
  uint16_t* entries;
  int per;         // k-tiles per split of K
  float* partial;  // dense, more than one split: [splits, M, N]
};

template <WeightFormat F, int BN, int MSub, Out kOut>
__global__ void __launch_bounds__(kThreads, (Cta<F, BN, MSub>::kPerSm)) gemm_kernel(const __grid_constant__ CUtensorMap xmap,
                                                                                     const __grid_constant__ GemmArgs a) {
  using C = Cta<F, BN, MSub>;
  constexpr bool kFp4 = C::kFp4;
  constexpr int kStages = C::kStages, kBM = C::kBM;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t smem0 = (smem_addr(smem_raw) + 1023) & ~1023u;  // the swizzle's 1024-byte alignment
  const uint32_t full0 = smem0 + kStages * C::kStage, empty0 = full0 + 8 * kStages;
  const int tid = int(threadIdx.x), wg = tid / 128;
  const int N = a.N, K = a.K;
  // This CTA's k-tiles: kt0 .. kt0 + KT (the grouped forms take the whole of K).
  constexpr bool kDense = kOut == Out::Dense || kOut == Out::Groups;
  const int kt0 = kDense ? int(blockIdx.y) * a.per : 0;
  const int KT = kDense ? min(K / kBK - kt0, a.per) : K / kBK;
  wait_for_inputs();

  // The CTA's tile: weight rows n0 .., activation rows r0 .. r0 + rows (of the map; fewer than BN
  // valid at the end).
  int n0, r0, rows, first = 0;
  const uint8_t* __restrict__ w;
  const uint8_t* __restrict__ wscale;
  if constexpr (kDense) {
    const int tiles_m = int((int64_t(a.M) + BN - 1) / BN);  // M < 2^31 (usable): no overflow on the way
    r0 = int(blockIdx.x) % tiles_m * BN, n0 = int(blockIdx.x) / tiles_m * kBM, rows = a.M - r0;
    w = a.w, wscale = a.wscale;  // group z's from the producer's offsets below
  } else {
    // One expert's CTAs are consecutive in x, so those that read its weight tile run together.
    const int per = int(a.tiles.max) * a.subs, i = int(blockIdx.x) % per, tt = i / a.subs, sub = i % a.subs;
    if (tt >= *a.tiles.count) return;
    const int4 tile = a.tiles.tile[tt];
    rows = tile.z - sub * BN;
    if (rows <= 0) return;
    r0 = tt * int(kTileRows) + sub * BN, n0 = int(blockIdx.x) / per * kBM, first = tile.y + sub * BN;
    const int matrix = blockIdx.z == 0 ? a.matrix[0] : a.matrix[1];
    w = a.table[tile.x].data[matrix], wscale = a.table[tile.x].scale[matrix];
  }

  // full[s]: the producer's 128 cp.async arrivals + its copy-engine transaction; empty[s]: one
  // arrival per consumer thread.
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      barrier_init(full0 + 8 * s, 129);
      barrier_init(empty0 + 8 * s, 128 * kConsumers);
    }
    barrier_init_fence();
  }
  __syncthreads();

  if (wg == kConsumers) {
    // ---- the producer ----
    if constexpr (C::kPerSm == 1) regs_shrink<kProducerRegs>();
    const int t = tid - 128 * kConsumers;
    const int64_t row_bytes = kFp4 ? K / 2 : K, kblocks = K / 32;
    // Groups: group z's first column of A and weight row (fp8's scale rows are 32 weight rows
    // each: N % 32 == 0 with groups).
    const int x0 = kOut == Out::Groups ? int(blockIdx.z) * K : 0;
    const int64_t nz = kOut == Out::Groups ? int64_t(blockIdx.z) * N : 0;

    constexpr int kChunksPerRow = C::kRowBytes / 16, kChunks = kBM * kChunksPerRow / 128;
    // Grouped: the expert's matrix in gemm.cuh's tile layout (a wide tile's second half may lie
    // past the last tile of rows: it reads that tile's last row, as dense rows past N read row N - 1).
    const TileLayout tiled{kFp4, N, K};
    const int64_t last = tiled.n_tiles() * kTileRows - 1;
    for (int i = 0; i < KT; ++i) {
      const int s = i % kStages, kt = kt0 + i;
      if (i >= kStages) barrier_wait(empty0 + 8 * s, (i / kStages - 1) & 1);
      const uint32_t base = smem0 + uint32_t(s * C::kStage), full = full0 + 8 * s;
      if (t == 0) {
        barrier_arrive_expect(full, C::kX);
        tma_load_2d(base, &xmap, x0 + kt * kBK, r0, full);
        tma_load_2d(base + C::kPanel, &xmap, x0 + kt * kBK + 64, r0, full);
      }
      // Weight rows past N read row N - 1 (their outputs are not stored). fp8 rows' chunk c sits at
      // c ^ (row & 1): the consumers' 32-byte reads of rows g, g+1 then hit distinct banks.
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        const int c = t + 128 * i, row = c / kChunksPerRow, ch = c % kChunksPerRow;
        const uint32_t at = uint32_t(row * C::kRowBytes + ((kFp4 ? ch : ch ^ (row & 1)) << 4));
        const int64_t from = kDense ? (nz + min(n0 + row, N - 1)) * row_bytes + int64_t(kt) * C::kRowBytes
                                    : tiled.code(min(int64_t(n0 + row), last), kt);
        cp_async16(base + uint32_t(C::kX) + at, w + from + ch * 16, true);
      }
      if constexpr (kFp4) {
#pragma unroll
        for (int i = 0; i < kBM / 128; ++i) {
          const int row = t + 128 * i;
          const int64_t from = kDense ? (nz + min(n0 + row, N - 1)) * kblocks + 4 * kt : tiled.scale(min(int64_t(n0 + row), last), kt);
          cp_async4(base + uint32_t(C::kX + C::kW + 4 * row), wscale + from);
        }
      } else if (t < kBM / 32) {
        const int64_t from =
            kDense ? (nz + min(n0 + 32 * t, N - 1)) / 32 * kblocks + 4 * kt : tiled.scale(min(int64_t(n0 + 32 * t), last), kt);
        cp_async4(base + uint32_t(C::kX + C::kW + 4 * t), wscale + from);
      }
      barrier_arrive_cp_async(full);
    }
    return;
  }

  // ---- the consumers ----
  if constexpr (C::kPerSm == 1) regs_grow<kConsumerRegs>();
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = wg * 64 * MSub + 16 * warp + g;  // this thread's first weight row in the CTA tile
  float acc[MSub][BN / 2];
#pragma unroll
  for (int s = 0; s < MSub; ++s)
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[s][i] = 0;
  // Pinned before the first MMA: otherwise the compiler may materialise the zeros later, between
  // MMAs, and ptxas then serialises every wgmma (C7515).
#pragma unroll
  for (int s = 0; s < MSub; ++s) keep(acc[s]);
  // A fragments in flight: the narrow tile's MMAs are short, so four keep the tensor cores fed while
  // the next steps' weights are widened; the wide tile's accumulators leave registers for two, and
  // so do the 48-row tile's within two CTAs an SM (with four, ptxas serialised its MMAs: C7512).
  constexpr int kBuffers = MSub == 1 && BN != 48 ? 4 : 2;
  uint32_t frag[kBuffers][MSub][4];
  Rows<kFp4, MSub> r;

  int stage = 0, phase = 0;  // kt's stage of the ring and the parity of its use
#pragma unroll 1
  for (int kt = 0; kt < KT; ++kt) {
    barrier_wait(full0 + 8 * stage, phase);
    const uint32_t base = smem0 + uint32_t(stage * C::kStage);
    const int release = stage == 0 ? kStages - 1 : stage - 1;  // the previous k-tile's stage
    // The stage's descriptor: its high word is a constant; steps add their offset to the low word
    // (shared memory ends below 256 KB: the 14-bit address field never carries out).
    const uint64_t b0 = kmajor_sw128(base);
    const uint32_t b0_lo = uint32_t(b0), b0_hi = uint32_t(b0 >> 32);
    // Whether any row of this warpgroup has a scale of 2 or more (e ≥ 128, too large to fold) in
    // this k-tile: each warp reads all of the warpgroup's scale bytes (fp4: 4 a row, 8·MSub a
    // lane; fp8: 4 per 32 rows, the same 8·MSub in every lane), so every warp finds the same
    // answer and the branch below, whose steps hold the warpgroup's MMAs, is taken alike by all
    // of its threads.
    const int wg_scales = kFp4 ? 4 * 64 * MSub * wg + 8 * MSub * lane : 8 * MSub * wg;  // this lane's bytes of them
    const uint32_t scales = base + uint32_t(C::kX + C::kW + wg_scales);
    uint32_t high;
    if constexpr (MSub == 1) {
      const uint2 v = lds64(scales);
      high = v.x | v.y;
    } else {
      const uint4 v = lds128(scales);
      high = v.x | v.y | v.z | v.w;
    }
    const bool rare = __any_sync(0xFFFFFFFFu, (high & 0x80808080u) != 0);
#pragma unroll
    for (int s = 0; s < MSub; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = row0 + 64 * s + 8 * h;
        const uint32_t at = base + uint32_t(C::kX + row * C::kRowBytes);
        uint32_t e;
        if constexpr (kFp4) {
          const uint4 v = lds128(at + 16 * t);
          r.w[s][h][0] = v.x, r.w[s][h][1] = v.y, r.w[s][h][2] = v.z, r.w[s][h][3] = v.w;
          e = lds8(base + uint32_t(C::kX + C::kW + 4 * row + t));
        } else {
          const uint4 v0 = lds128(at + uint32_t(((2 * t) ^ (row & 1)) << 4));
          const uint4 v1 = lds128(at + uint32_t(((2 * t + 1) ^ (row & 1)) << 4));
          r.w[s][h][0] = v0.x, r.w[s][h][1] = v0.y, r.w[s][h][2] = v0.z, r.w[s][h][3] = v0.w;
          r.w[s][h][4] = v1.x, r.w[s][h][5] = v1.y, r.w[s][h][6] = v1.z, r.w[s][h][7] = v1.w;
          e = lds8(base + uint32_t(C::kX + C::kW + 4 * (row / 32) + t));
        }
        r.scale[s][h] = rare ? pow2_bf16x2(e) : folded_scale_bf16x2<kFp4>(e);
      }
    // The 8 k16 steps in commit groups of kGroup (the narrow tile two: one wait, fence and commit
    // for two MMAs a sub-tile). Before a group, at most kBuffers / kGroup - 1 groups may still be
    // in flight, so the fragment registers of step J - kBuffers are free; at step kBuffers - kGroup
    // every MMA of the previous k-tile has completed and its stage goes back to the producer.
    constexpr int kGroup = kBuffers == 4 ? 2 : 1;
    auto widen = [&](auto J, auto kRare) {
      constexpr int j = decltype(J)::value;
#pragma unroll
      for (int s = 0; s < MSub; ++s) r.template fragment<j, decltype(kRare)::value>(s, frag[j % kBuffers][s]);
    };
    auto issue = [&](auto J) {
      constexpr int j = decltype(J)::value;
      const uint32_t lo = b0_lo + uint32_t(((j / 4) * C::kPanel + (j % 4) * 32) >> 4);  // the step's 16-byte offset
#pragma unroll
      for (int s = 0; s < MSub; ++s) mma_rs<BN>(acc[s], frag[j % kBuffers][s], uint64_t(b0_hi) << 32 | lo);
    };
    auto group = [&](auto G, auto kRare) {
      constexpr int j = decltype(G)::value * kGroup;
      if (kt > 0 || j > 0) mma_wait<kBuffers / kGroup - 1>();
      if (j == kBuffers - kGroup) barrier_arrive_if(empty0 + 8 * release, kt > 0);
      widen(std::integral_constant<int, j>{}, kRare);
      if constexpr (kGroup == 2) widen(std::integral_constant<int, j + 1>{}, kRare);
      mma_fence();
      issue(std::integral_constant<int, j>{});
      if constexpr (kGroup == 2) issue(std::integral_constant<int, j + 1>{});
      mma_commit();
    };
    auto steps = [&](auto kRare) {
      group(std::integral_constant<int, 0>{}, kRare);
      group(std::integral_constant<int, 1>{}, kRare);
      group(std::integral_constant<int, 2>{}, kRare);
      group(std::integral_constant<int, 3>{}, kRare);
      if constexpr (kGroup == 1) {
        group(std::integral_constant<int, 4>{}, kRare);
        group(std::integral_constant<int, 5>{}, kRare);
        group(std::integral_constant<int, 6>{}, kRare);
        group(std::integral_constant<int, 7>{}, kRare);
      }
    };
    if (rare) steps(std::true_type{});
    else steps(std::false_type{});
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  mma_wait<0>();
#pragma unroll
  for (int s = 0; s < MSub; ++s) keep(acc[s]);

  // y: weight row (feature) n0 + row0 + 64s + 8h, activation row (token) 8i + 2t + e of the tile,
  // from acc[s][4i + 2h + e]. Groups: group z's columns of y's rows (or of the split's partial).
  const int ldy = kOut == Out::Groups ? int(gridDim.z) * N : N;
  float* const dense = !kDense ? nullptr
                       : (a.partial ? a.partial + int64_t(blockIdx.y) * a.M * ldy : a.y) +
                             (kOut == Out::Groups ? int64_t(blockIdx.z) * N : 0);
#pragma unroll
  for (int s = 0; s < MSub; ++s)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int n = n0 + row0 + 64 * s + 8 * h;
      if (n >= N) continue;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int m = 8 * i + 2 * t + e;
          if (m >= rows) continue;
          const float v = acc[s][4 * i + 2 * h + e];
          if constexpr (kOut == Out::Entries) {
            a.entries[int64_t(a.tiles.list[first + m]) * N + n] = bf16_from_float(v);
          } else if constexpr (kOut == Out::Slots) {
            (blockIdx.z == 0 ? a.slots[0] : a.slots[1])[int64_t(r0 + m) * N + n] = round_bf16(v);
          } else {
            dense[int64_t(r0 + m) * ldy + n] = a.partial ? v : round_bf16(v);
          }
        }
    }
}

template <WeightFormat F, int BN, int MSub, Out kOut>
void launch_gemm(const CUtensorMap& map, const GemmArgs& a, dim3 grid, cudaStream_t stream) {
  constexpr int kBytes = Cta<F, BN, MSub>::kBytes;
  static const bool configured = [] {
    check(cudaFuncSetAttribute(gemm_kernel<F, BN, MSub, kOut>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes),
          "cuda::linear gemm");
    return true;
  }();
  (void)configured;
  launch_early("cuda::linear gemm", gemm_kernel<F, BN, MSub, kOut>, grid, kThreads, kBytes, stream, map, a);
}

// A tiling's shape: activation rows per CTA (the narrow one as few as `rows` needs) and weight rows.
struct Shape {
  int bn, msub;
  int weight_rows() const { return 64 * msub * kConsumers; }
  // CTA tiles over `rows` activation rows and N weight rows.
  int64_t tiles(int64_t rows, int64_t N) const {
    return (rows + bn - 1) / bn * ((N + weight_rows() - 1) / weight_rows());
  }
};
Shape shape_of(Tiling tiling, int64_t rows) {
  if (tiling == Tiling::wide) return {128, 2};
  return {rows <= 16 ? 16 : rows <= 32 ? 32 : rows <= 48 ? 48 : 64, 1};
}

template <Out kOut>
void launch_for(WeightFormat f, Shape shape, const CUtensorMap& map, const GemmArgs& a, dim3 grid,
                cudaStream_t stream) {
  const auto launch = [&](auto BN, auto MSub) {
    constexpr int bn = decltype(BN)::value, msub = decltype(MSub)::value;
    if (f == WeightFormat::FP4) launch_gemm<WeightFormat::FP4, bn, msub, kOut>(map, a, grid, stream);
    else launch_gemm<WeightFormat::FP8, bn, msub, kOut>(map, a, grid, stream);
  };
  using I = std::integral_constant<int, 1>;
  switch (shape.bn) {
    case 128:
      if constexpr (kOut == Out::Groups) fail("cuda::linear gemm", "the narrow tiling with groups", "the wide one");
      else return launch(std::integral_constant<int, 128>{}, std::integral_constant<int, 2>{});
    case 64: return launch(std::integral_constant<int, 64>{}, I{});
    case 48: return launch(std::integral_constant<int, 48>{}, I{});
    case 32: return launch(std::integral_constant<int, 32>{}, I{});
    default: return launch(std::integral_constant<int, 16>{}, I{});
  }
}

// A grouped launch: CTAs of the tiling's rows, enough for tiles of tiles.most rows, for every
// possible tile of every N tile, `matrices` along z.
template <Out kOut>
void launch_grouped(const uint16_t* xq, WeightFormat f, Tiling tiling, GemmArgs& a, int matrices, cudaStream_t stream) {
  if (tiling == Tiling::automatic) fail("cuda::gemm grouped", "a wide or narrow tiling", "automatic");
  const int64_t most = std::min<int64_t>(a.tiles.most, kTileRows);
  const Shape shape = shape_of(tiling, std::min(a.tiles.expect, most));
  a.subs = int((most + shape.bn - 1) / shape.bn);
  a.per = a.K / kBK;
  const CUtensorMap map = bf16_tile_map(xq, a.tiles.slots(), a.K, shape.bn, "cuda::gemm grouped");
  const dim3 grid{unsigned(a.tiles.max * a.subs * shape.tiles(1, a.N)), 1u, unsigned(matrices)};
  launch_for<kOut>(f, shape, map, a, grid, stream);
}

}  // namespace

bool aligned(const uint8_t* data, const uint8_t* scale) {
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && reinterpret_cast<uintptr_t>(scale) % 4 == 0;
}

bool usable(int64_t M, const Weight& w) {
  // 32-bit tile and row counts; 64-bit offsets elsewhere.
  const int64_t limit = int64_t(1) << 31;
  return w.quantized() && M >= kMinRows && w.cols % kTileK == 0 && w.cols > 0 && w.rows > 0 && M < limit &&
         w.rows < limit && w.cols < limit && w.scale != nullptr && aligned(w.data, w.scale);
}

void act_quant(const float* x, int64_t M, int64_t K, uint16_t* xq, cudaStream_t stream) {
  if (M <= 0) return;
  if (K % kTileK != 0) fail("cuda::gemm::act_quant", "K a multiple of 128", "K = " + std::to_string(K));
  RowSource src;
  src.x = x;
  launch_act_quant(src, M, K, xq, stream);
}

Tiling dense_tiling(int64_t M, int64_t N) {
  const Shape wide = shape_of(Tiling::wide, M);
  const int64_t wide_tiles = wide.tiles(M, N);
  // A wide tile per SM or more: wide (its weight tiles are read once per 128 rows, narrow's once per
  // 64 or fewer); below it narrow's smaller tiles fill more SMs.
  return wide_tiles < int64_t(multiprocessors("cuda::linear gemm")) ? Tiling::narrow : Tiling::wide;
}

void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream, Tiling tiling) {
  linear_groups(x, M, 1, w, y, true, stream, tiling);
}

bool usable_groups(int64_t M, int64_t groups, const Weight& w) {
  if (groups < 1 || groups >= 65536 || w.rows % groups != 0) return false;
  Weight group = w;
  group.rows = w.rows / groups;
  return (w.format != WeightFormat::FP8 || groups == 1 || group.rows % 32 == 0) && usable(M, group) &&
         M * groups * w.cols < (int64_t(1) << 31);
}

void linear_groups(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, bool quantize,
                   cudaStream_t stream, Tiling tiling) {
  const int64_t N = groups > 0 ? w.rows / groups : 0, K = w.cols;
  if (!usable_groups(M, groups, w))
    fail("cuda::linear gemm",
         "an fp8/fp4 weight (aligned) in groups of whole 32-row blocks, M >= " + std::to_string(kMinRows) + ", K % 128 == 0",
         std::to_string(w.rows) + "x" + std::to_string(K) + " in " + std::to_string(groups) + " groups at " + std::to_string(M) +
             " rows");
  const bool automatic = tiling == Tiling::automatic;
  if (automatic) tiling = groups > 1 ? Tiling::narrow : dense_tiling(M, w.rows);  // groups: narrow alone (gemm.cuh)
  const Shape shape = shape_of(tiling, M);
  keep_scratch_pool();
  uint16_t* xq = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&xq), size_t(M * groups * K) * 2, stream), "cuda::linear gemm");
  if (quantize) {
    act_quant(x, M, groups * K, xq, stream);
  } else {
    PlainRowSource src;
    src.x = x;
    launch_act_quant(src, M, groups * K, xq, stream);
  }
  const CUtensorMap map = bf16_tile_map(xq, M, groups * K, shape.bn, "cuda::linear gemm");
  GemmArgs a{};
  a.M = int(M), a.N = int(N), a.K = int(K), a.w = w.data, a.wscale = w.scale, a.y = y;
  const int64_t tiles = shape.tiles(M, N);
  const SplitK split = automatic ? split_k(tiles * groups, K / kBK, kMinSplitTiles) : SplitK{1, int(K / kBK)};
  a.per = split.per;
  if (split.splits > 1)
    check(cudaMallocAsync(reinterpret_cast<void**>(&a.partial), size_t(split.splits * M * w.rows) * 4, stream),
          "cuda::linear gemm");
  const dim3 grid{unsigned(tiles), unsigned(split.splits), unsigned(groups)};
  if (groups == 1) launch_for<Out::Dense>(w.format, shape, map, a, grid, stream);
  else launch_for<Out::Groups>(w.format, shape, map, a, grid, stream);
  if (split.splits > 1) {
    sum_splits(a.partial, split.splits, M * w.rows, y, true, stream);
    check(cudaFreeAsync(a.partial, stream), "cuda::linear gemm");
  }
  check(cudaFreeAsync(xq, stream), "cuda::linear gemm");
}

bool grouped_usable(WeightFormat up, WeightFormat down, int64_t dim, int64_t inter, int64_t max_tiles) {
  const auto quantized = [](WeightFormat f) { return f == WeightFormat::FP4 || f == WeightFormat::FP8; };
  const int64_t limit = int64_t(1) << 31, slots = max_tiles * kTileRows;
  return quantized(up) && quantized(down) && dim > 0 && inter > 0 && dim % kTileK == 0 && inter % kTileK == 0 &&
         max_tiles > 0 && slots < limit && std::max(dim, inter) < limit &&
         max_tiles * kTileRows / 16 * ((std::max(dim, inter) + 127) / 128) < limit;
}

void act_quant_slots(const float* x, int64_t K, const Tiles& tiles, int k, uint16_t* xq, cudaStream_t stream) {
  if (K % kTileK != 0) fail("cuda::gemm::act_quant_slots", "K a multiple of 128", "K = " + std::to_string(K));
  if (k <= 0) fail("cuda::gemm::act_quant_slots", "top-k of at least 1", "k = " + std::to_string(k));
  RowSource src;
  src.x = x, src.slot = tiles.slot, src.list = tiles.list, src.k = k;
  launch_act_quant(src, tiles.entries, K, xq, stream);
}

void act_quant_swiglu_slots(const float* g, const float* u, int64_t inter, const Tiles& tiles, float limit,
                            const float* weights, uint16_t* xq, cudaStream_t stream) {
  if (inter % kTileK != 0)
    fail("cuda::gemm::act_quant_swiglu_slots", "inter a multiple of 128", "inter = " + std::to_string(inter));
  launch_act_quant(SwigluSource{g, u, tiles.slot, tiles.list, weights, limit}, tiles.entries, inter, xq, stream);
}

void grouped_up(const uint16_t* xq, const Tiles& tiles, const ExpertPointers* table, WeightFormat format,
                Tiling tiling, int64_t dim, int64_t inter, float* g, float* u, cudaStream_t stream) {
  GemmArgs a{};
  a.N = int(inter), a.K = int(dim);
  a.tiles = tiles, a.table = table, a.matrix[0] = 0, a.matrix[1] = 2, a.slots[0] = g, a.slots[1] = u;
  launch_grouped<Out::Slots>(xq, format, tiling, a, 2, stream);
}

void grouped_down(const uint16_t* xq, const Tiles& tiles, const ExpertPointers* table, WeightFormat format,
                  Tiling tiling, int64_t inter, int64_t dim, uint16_t* ye, cudaStream_t stream) {
  GemmArgs a{};
  a.N = int(dim), a.K = int(inter);
  a.tiles = tiles, a.table = table, a.matrix[0] = a.matrix[1] = 1, a.entries = ye;
  launch_grouped<Out::Entries>(xq, format, tiling, a, 1, stream);
}

}  // namespace dsv41::cuda::gemm
