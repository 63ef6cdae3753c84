#pragma once
// The GEMM of cuda::linear over fp8/fp4 weights (gemm.cu): Hopper's warpgroup MMA on bf16
// operands that are the exact values of the reference's quantized ones (the activations' act_quant
// values x_q·s, the weights' w_q·s), with the CPU op's per-32-block scaling folded into them.
// Internal to the CUDA backend: linear.cu calls it for M ≥ kMinRows, cuda::moe its grouped form
// for the routed experts, and the tests reach the act-quantization step directly.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/weight.h"
#include "numerics/types.h"

namespace dsv41::cuda::gemm {

// The fewest activation rows for which linear() takes the GEMM (below it, qgemv). From 2 rows the
// GEMM's narrow tiles read each weight once at the weights' widening rate, where qgemv's FMAs on
// the CUDA cores grow with the rows (docs/benchmarks.md, "Small batches on the tensor cores").
inline constexpr int64_t kMinRows = 2;
// Rows of one grouped tile (cuda::moe's bucket step cuts each expert's entries into tiles of ≤ this).
inline constexpr int64_t kTileRows = 128;
// K must be a multiple of this (one k-tile: four 32-blocks); other K go to qgemv.
inline constexpr int64_t kTileK = 128;

// Whether the kernel can read a weight stored at data / scale: codes 16 bytes and scales 4 bytes at
// a time (each device weight is its own allocation; a view into a packed buffer may not be).
bool aligned(const uint8_t* data, const uint8_t* scale);

// Whether linear(x, M, w) runs here: an fp8/fp4 weight, M ≥ kMinRows, K a multiple of kTileK, aligned.
bool usable(int64_t M, const Weight& w);

// How the CTAs tile the output (gemm.cu): wide, 256 weight rows × 128 activation rows per CTA,
// for many rows; narrow, 128 weight rows × 16, 32, 48 or 64 activation rows (as few as the rows
// need), for decode and prefill's small projections. Every output is the same sequence of MMAs
// over the same operands in either, so the choice is one of speed alone.
enum class Tiling { automatic, wide, narrow };

// automatic for linear(): narrow while the wide tiling would leave an SM without a CTA.
Tiling dense_tiling(int64_t M, int64_t N);

// y[M, N] = x[M, K] · Wᵀ for an fp8/fp4 weight, rounded to bf16 (cuda::linear's contract). Scratch
// (the act-quantized x as bf16: M·K·2 bytes; with split-K, the automatic tiling's choice for
// grids that would leave SMs idle, splits·M·N·4 bytes of partial sums) from cudaMallocAsync on
// `stream`. A forced tiling never splits K.
void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream,
            Tiling tiling = Tiling::automatic);
// linear by groups (cuda::linear_grouped's contract): w's rows in `groups` groups of N = rows /
// groups (fp8: whole 32-row scale blocks), group g's product y[:, gN .. gN + N) = x[:, gK .. gK + K)
// · W_gᵀ, in one launch (grid z the group). `quantize` false: x's bf16 values multiplied as they
// are, not act-quantized (wo_a, which the reference multiplies in bf16 by its weight's
// dequantization: the products are those of gemm_bf16 over the widened weight, summed in this
// kernel's order). Groups take the narrow tiling alone (several row tiles past 64 rows: for
// decode-sized M). Scratch as linear's, M·groups·K·2 bytes of x.
void linear_groups(const float* x, int64_t M, int64_t groups, const Weight& w, float* y, bool quantize,
                   cudaStream_t stream, Tiling tiling = Tiling::automatic);
// Whether linear_groups takes w in `groups` groups at M rows (usable for one group's rows, fp8
// groups of whole 32-row scale blocks, the x of all groups within 32-bit offsets).
bool usable_groups(int64_t M, int64_t groups, const Weight& w);
// ---- the grouped form: cuda::moe's routed experts --------------------------------------------

// The routed experts' tile layout (docs/formats.md, "Routed experts on the device"). An ExpertTable
// stores each fp8/fp4 matrix [N, K] as tiles of kTileRows rows × one k-tile of kTileK values: tile
// (nt, kt) is the kt-th segment (64 bytes of e2m1, 128 of e4m3) of rows nt·128 .. nt·128 + 127,
// one after another, and the tiles run kt fastest. The grouped GEMM's stage (128 rows, one k-tile)
// is then one contiguous run of 8 or 16 KB where row-major rows gave 64- or 128-byte pieces K/2 or
// K bytes apart: 1.8–2.0 TB/s against 3.0 for contiguous runs on an H100 (docs/benchmarks.md,
// session 22). N and K are padded to whole tiles with zero bytes. The scale bytes alike, one run
// per tile: fp4's four a row ([128 rows][4 blocks]), fp8's 4 × 4 ([4 row blocks of 32][4 blocks]).
struct TileLayout {
  bool fp4;
  int64_t N, K;
  DSV41_HD int64_t row_bytes() const { return fp4 ? kTileK / 2 : kTileK; }  // a row's segment of one tile
  DSV41_HD int64_t k_tiles() const { return (K + kTileK - 1) / kTileK; }
  DSV41_HD int64_t n_tiles() const { return (N + kTileRows - 1) / kTileRows; }
  DSV41_HD int64_t tile_scales() const { return fp4 ? kTileRows * 4 : 16; }
  DSV41_HD int64_t code_bytes() const { return n_tiles() * k_tiles() * kTileRows * row_bytes(); }
  DSV41_HD int64_t scale_bytes() const { return n_tiles() * k_tiles() * tile_scales(); }
  // Row n's segment of k-tile kt, and the first of its scale bytes there (fp4: its 4 blocks; fp8:
  // the 4 blocks of its 32-row block).
  DSV41_HD int64_t code(int64_t n, int64_t kt) const {
    return ((n / kTileRows) * k_tiles() + kt) * kTileRows * row_bytes() + (n % kTileRows) * row_bytes();
  }
  DSV41_HD int64_t scale(int64_t n, int64_t kt) const {
    return ((n / kTileRows) * k_tiles() + kt) * tile_scales() + (n % kTileRows) / (fp4 ? 1 : 32) * 4;
  }
};

// The device array an ExpertTable owns (moe.h): expert e's weights, index 0 = w1, 1 = w2, 2 = w3,
// fp8/fp4 ones in the tile layout above, bf16 ones row-major.
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
// slot[j] is list position j's slot (-1 past the live entries): the per-entry steps (act_quant,
// SwiGLU) run over the `entries` list positions, not over every slot the grid could hold.
struct Tiles {
  const int4* tile;
  const int* count;
  int64_t max;
  const int32_t* list;
  const int32_t* slot;
  int64_t entries;
  int64_t most = kTileRows;
  int64_t expect = kTileRows;  // rows a tile holds but rarely exceeds (the narrow tiling's BN covers it)
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

// act_quant of the slot rows: list position j's slot from x[list[j] / k] (x holds one row per
// token, the layer's input; k the top-k). Padding slots are not written (each output column of the
// GEMM reads its own row alone, and padding columns are not stored). xq: slots·K bf16 in
// value_offset's order.
void act_quant_slots(const float* x, int64_t K, const Tiles& tiles, int k, uint16_t* xq, cudaStream_t stream);

// act_quant_slots of the hidden values h = swiglu(g, u) (swiglu.cuh) with list position j's
// routing weight weights[list[j]], formed as g and u [slots, inter] are read: h is never stored.
void act_quant_swiglu_slots(const float* g, const float* u, int64_t inter, const Tiles& tiles, float limit,
                            const float* weights, uint16_t* xq, cudaStream_t stream);

// g, u [slots, inter] (bf16 values) = A · w1ᵀ, A · w3ᵀ of each tile's expert, A = act_quant_slots
// of the input (dim features).
void grouped_up(const uint16_t* xq, const Tiles& tiles, const ExpertPointers* table, WeightFormat format,
                Tiling tiling, int64_t dim, int64_t inter, float* g, float* u, cudaStream_t stream);

// ye[list[first + i], dim] (bf16 bits) = A · w2ᵀ of each tile's expert, A = act_quant_swiglu_slots
// of the up GEMM's outputs (inter features).
void grouped_down(const uint16_t* xq, const Tiles& tiles, const ExpertPointers* table, WeightFormat format,
                  Tiling tiling, int64_t inter, int64_t dim, uint16_t* ye, cudaStream_t stream);

// ---- the act-quantization step, exposed for the tests ----

// Where act_quant puts x[m, k]'s value in xq ([M, K] row-major, the 128 values of each k-tile
// permuted): position 16j + c of a k-tile holds the value the MMA's k16 step j takes at column
// c, which is value 4j + 2(c % 2) + c / 8 of 32-block (c % 8) / 2. So the A fragment a thread
// gives step j (columns 2t, 2t+1, 2t+8, 2t+9) is values 4j, 4j+2, 4j+1, 4j+3 of block t of its
// weight row: each thread reads whole 32-blocks of the weights, with one scale, and each of its
// fragment registers pairs the codes of two bytes in the same place (gemm.cu says why).
DSV41_HD inline int64_t value_offset(int64_t m, int64_t k, int64_t K) {
  const int i = int(k & 31), block = int(k & 127) / 32;
  const int position = 16 * (i / 4) + 8 * (i % 2) + 2 * block + i % 4 / 2;
  return m * K + (k & ~int64_t(127)) + position;
}

// act_quant of x[M, K] (fp32, bf16 values) as qgemv and the CPU do it (the e4m3 codes of x / s
// with power-of-two block scales s per 32), written as the values code·s, exact in bf16.
// xq: M·K bf16.
void act_quant(const float* x, int64_t M, int64_t K, uint16_t* xq, cudaStream_t stream);

}  // namespace dsv41::cuda::gemm
