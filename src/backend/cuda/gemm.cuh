#pragma once
// The GEMM of cuda::linear over fp8/fp4 weights (gemm.cu): tensor-core mma.sync (f16 HMMA on
// exactly converted e4m3 operands), with the CPU op's per-32-block scaling. Internal to the CUDA
// backend: linear.cu calls it for M ≥ kMinRows, cuda::moe its grouped form for the routed
// experts, and the tests reach the act-quantization step directly.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"
#include "numerics/types.h"

namespace dsv41::cuda::gemm {

// The fewest activation rows for which linear() takes the GEMM (below it, qgemv's passes of 8).
inline constexpr int64_t kMinRows = 64;
// Rows of one M tile: the act-quantized x's scales are laid out per tile of this many rows.
inline constexpr int64_t kTileRows = 128;
// K must be a multiple of this (one k-tile: four 32-blocks); other K go to qgemv.
inline constexpr int64_t kTileK = 128;

// Whether linear(x, M, w) runs here: an fp8/fp4 weight, M ≥ kMinRows, K a multiple of kTileK.
bool usable(int64_t M, const Weight& w);

// How the CTAs tile the rows (gemm.cu): wide, 128 rows per CTA, for many rows; narrow, 32 rows
// per CTA with all its warps across the columns, for few (decode; prefill's small projections).
// Both compute every output with the same instructions in the same order: their results are equal
// bit for bit, so the choice is one of speed alone.
enum class Tiling { automatic, wide, narrow };

// automatic for linear(): narrow while the wide tiling would leave an SM without a CTA.
Tiling dense_tiling(int64_t M, int64_t N);

// y[M, N] = x[M, K] · Wᵀ for an fp8/fp4 weight, rounded to bf16 (cuda::linear's contract). Scratch
// (the quantized x: M·K bytes + M·K/8 bytes of scales) from cudaMallocAsync on `stream`.
void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream,
            Tiling tiling = Tiling::automatic);

// ---- the grouped form: cuda::moe's routed experts --------------------------------------------

// The device array an ExpertTable owns (moe.h): expert e's weights, index 0 = w1, 1 = w2, 2 = w3.
struct ExpertPointers {
  const uint8_t* data[3];
  const uint8_t* scale[3];
};

// The routed entries in row tiles of one expert each (cuda::moe's bucket step, on the device):
// tile t < *count is (expert, first list position, rows ≤ kTileRows), and list[first + i] is
// its row i's entry (entry = token·k + slot). A tile's rows are the slots t·kTileRows + i of
// [max·kTileRows, ·] matrices ("slot order"); the grids are sized for `max` tiles of at most
// `most` rows and blocks past *count or a tile's rows exit at once, so the host needs no count (a
// CUDA graph can hold the calls).
struct Tiles {
  const int4* tile;
  const int* count;
  int64_t max;
  const int32_t* list;
  int64_t most = kTileRows;
  DSV41_HD int64_t slots() const { return max * kTileRows; }
};

// The grouped launches' tiling for `entries` routed over `experts`: narrow while an expert holds
// half a wide tile or less on average (decode; prefill over many experts).
inline Tiling grouped_tiling(int64_t entries, int64_t experts) {
  return entries * 2 <= experts * kTileRows ? Tiling::narrow : Tiling::wide;
}

// Whether grouped_up/grouped_down take experts of this shape: fp8/fp4 w1, w3 [inter, dim] and w2
// [dim, inter], dim and inter multiples of kTileK, slot offsets within 32 bits.
bool grouped_usable(WeightFormat up, WeightFormat down, int64_t dim, int64_t inter, int64_t max_tiles);

// act_quant of the slot rows: slot (t, i) from x[list[first + i] / k] (k > 0: x holds one row per
// token, the layer's input) or from x's own slot row (k = 0: x in slot order, the hidden values).
// Padding slots get scale 0 and no codes. codes: slots·K bytes; scales: (K/32)·slots floats.
void act_quant_slots(const float* x, int64_t K, const Tiles& tiles, int k, bool fp4_order, uint8_t* codes,
                     float* scales, cudaStream_t stream);

// g, u [slots, inter] (bf16 values) = A · w1ᵀ, A · w3ᵀ of each tile's expert, A = act_quant_slots
// of the input (dim features, fp4_order for fp4 weights).
void grouped_up(const uint8_t* codes, const float* scales, const Tiles& tiles, const ExpertPointers* table,
                WeightFormat format, Tiling tiling, int64_t dim, int64_t inter, float* g, float* u, cudaStream_t stream);

// ye[list[first + i], dim] (bf16 bits) = A · w2ᵀ of each tile's expert, A = act_quant_slots of the
// hidden values (inter features).
void grouped_down(const uint8_t* codes, const float* scales, const Tiles& tiles, const ExpertPointers* table,
                  WeightFormat format, Tiling tiling, int64_t inter, int64_t dim, uint16_t* ye, cudaStream_t stream);

// ---- the act-quantization step, exposed for the tests ----

// Rows of the scale array: M rounded up to kTileRows.
inline int64_t padded_rows(int64_t M) { return (M + kTileRows - 1) / kTileRows * kTileRows; }

// Where act_quant puts the e4m3 code of x[m, k] (an offset into codes, [M, K] row-major with the
// 32 values of each block permuted when fp4_order), and the scale of x[m, 32b..32b+31] (an offset
// into scales, [K/32, padded_rows(M)] with the rows of each 32-row group permuted so that the two
// rows g, g + 8 of each m16 tile that a thread reads are consecutive, its m16 tiles' pairs too).
// The GEMM's fragment loads read them in these orders (gemm.cu says why).
DSV41_HD inline int64_t code_offset(int64_t m, int64_t k, int64_t K, bool fp4_order) {
  if (!fp4_order) return m * K + k;
  const int64_t base = k & ~int64_t(31);
  const int i = int(k & 31), t = i / 8, j = i % 8;  // value j of quarter t
  return m * K + base + (j < 4 ? 4 * t + j : 16 + 4 * t + j - 4);
}
DSV41_HD inline int64_t scale_offset(int64_t m, int64_t b, int64_t Mpad) {
  const int r = int(m & 31), mt = r / 16, h = r % 16 / 8, g = r % 8;
  return b * Mpad + (m & ~int64_t(31)) + g * 4 + mt * 2 + h;
}

// act_quant of x[M, K] (fp32, bf16 values) as qgemv and the CPU do it: e4m3 codes of x / s and
// the power-of-two block scales s per 32 (scales of the padding rows M..padded_rows(M) are 0).
// codes: M·K bytes; scales: (K/32)·padded_rows(M) floats.
void act_quant(const float* x, int64_t M, int64_t K, bool fp4_order, uint8_t* codes, float* scales,
               cudaStream_t stream);

}  // namespace dsv41::cuda::gemm
