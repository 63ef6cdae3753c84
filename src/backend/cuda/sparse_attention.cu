// Sparse attention decode over the SWA-FP8 ring and the KV-FP4 cache.
//
// Each token attends to its entry list (W window entries, then K selected compressed ones). The
// CPU op walks the list in tiles of 64 entries, its softmax blocks: per tile and head it takes the
// scores, raises the running maximum to the tile's, adds the tile's exponentials to the
// denominator and the bf16-rounded probabilities times the entries to the accumulator, both
// rescaled to the new maximum. The kernels decode each tile from its stored format into shared
// memory as bf16 (exact: an e4m3 or e2m1 value times its scale has at most 8 significant bits)
// and follow the CPU's steps (same tiles, same running maximum, same bf16 rounding of p, entry
// order in P·V), so the results differ from the CPU's only by the order of the fp32 sums in the
// dot products and denominators and by expf's last bit.
//
// Two paths compute the same thing, bit for bit: every value below (a score, a tile's maximum,
// the running maximum, p, a tile's sums, the rescaled accumulator) is computed by the same
// device function from the same inputs in the same order; only which block computes it changes.
//
// One block per (token, group of G heads) [attention_kernel]: the block walks the token's tiles
// one after another, four steps each (decode, scores, softmax step, P·V). At batch 1 that is H
// blocks (G = 1), each taking 10 tiles (V4.1) in sequence, mostly waiting on the loads of the
// decode: 64 blocks on the H200's 132 multiprocessors.
//
// Split over tiles [split_scores_kernel, split_pv_kernel, split_combine_kernel], for batches too
// small to fill the GPU with the former: the tiles of a token are independent except through the
// running maximum, which needs only every tile's maximum score. So one kernel scores every
// (token, head group, tile) at once and writes the scores and the tiles' maxima; a second, over
// the same grid, forms each tile's running maximum from the maxima before it, its probabilities,
// its sums and its P·V, and writes them; a third runs the online softmax's rescaling recurrence
// over the tiles' sums in tile order, which is all that is sequential in it.
//
// At D = 512 the tensor cores compute the products: a split over tiles with mma.sync while its
// blocks (token, 32 heads, tile) fit in three waves [split_mma_*, V4.1 decode: up to 19 tokens],
// then one block per (token, 64 heads) with wgmma [wgmma_attention_kernel], or, where the heads
// are not a multiple of 64, one per (token, 32 heads) with mma.sync [mma_attention_kernel]; all
// below, with the softmax steps above.
//
// Traffic per token: (W·528 + K·288) bytes for dim 512 from memory (once; the other blocks that
// decode the tile re-read it from L2), 2·H·dim·4 for q and out. V4.1 decode: 128·528 + 512·288 =
// 215 KB. Work per token: 2·H·(W + K)·dim multiply-adds (42 M for V4.1), plus the decode of each
// tile by every block that reads it (H/G blocks; on the split path two per group of G heads, which
// also passes its scratch, below, through L2).
#include "backend/cuda/sparse_attention.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/ptx.cuh"
#include "backend/cuda/wgmma.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;  // entries per softmax block, as the CPU op (and the reference kernel)
// The running maximum before the first tile, as the CPU op: finite, so an all-empty row gives
// zeros, not NaN.
constexpr float kInitialMax = -1e30f;

// ---- the steps of a tile, shared by both paths -------------------------------------------------

// A tile of decoded entries: bf16 bits, zeros for an empty slot, and which slots hold an entry.
template <int D>
struct Tile {
  alignas(16) uint16_t row[kTile][D];
  bool valid[kTile];
};

// A warp decodes one entry into `row` as bf16 bits; each lane takes 4 (SWA-FP8) or 8 (KV-FP4)
// consecutive channels per step, so the warp's loads are contiguous and its shared-memory stores
// (8 or 16 bytes a lane, consecutive) are free of bank conflicts. The loads and the decode are
// separate functions so that a warp can have all of its entries' loads in flight at once.
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  return (float_bits(lo) >> 16) | (float_bits(hi) & 0xFFFF0000u);  // exact: the values are bf16
}

template <int D>
constexpr int kSwaSteps = (D + 127) / 128;  // a lane's steps over an SWA-FP8 entry (4 channels each)
template <int D>
constexpr int kKvSteps = (D + 255) / 256;  // over a KV-FP4 entry (8 channels each)

// A lane's share of one entry's bytes: per step a word of codes and the byte of their scale.
template <int D>
struct Raw {
  uint32_t word[kSwaSteps<D>], scale[kSwaSteps<D>];
};

template <int D>
__device__ __forceinline__ void load_swa_fp8(const uint8_t* entry, int lane, Raw<D>& raw) {
#pragma unroll
  for (int i = 0; i < kSwaSteps<D>; ++i) {
    const int c = 4 * lane + 128 * i;
    if (c >= D) break;
    if constexpr (swa_fp8::bytes(D) % 4 == 0) raw.word[i] = *reinterpret_cast<const uint32_t*>(entry + c);
    else raw.word[i] = entry[c] | entry[c + 1] << 8 | entry[c + 2] << 16 | uint32_t(entry[c + 3]) << 24;
    raw.scale[i] = entry[swa_fp8::scales_offset(D) + c / swa_fp8::kBlock];
  }
}

// Where channel c of a decoded row goes: plainly at c, or (a swizzled row, the tensor-core path's)
// with its 8-channel chunk XORed by `x`, the row's low 3 bits, so that ldmatrix's 8 rows of one
// chunk column fall into distinct banks. A lane's 4 or 8 channels stay within one chunk.
__device__ __forceinline__ int channel_at(int c, int x) { return (((c >> 3) ^ x) << 3) | (c & 7); }

// The decoders write a lane's channels c .. c + 3 (or + 7) to at(c): consecutive there. Each
// value is the code's times its block's scale, exact in bf16 (dequant.cuh: straight to bf16).
template <int D, class At>
__device__ __forceinline__ void decode_swa_fp8(const Raw<D>& raw, int lane, At at) {
#pragma unroll
  for (int i = 0; i < kSwaSteps<D>; ++i) {
    const int c = 4 * lane + 128 * i;
    if (c >= D) break;
    const uint32_t scale = pow2_bf16x2(raw.scale[i]);
    *reinterpret_cast<uint2*>(at(c)) = make_uint2(mul_bf16x2(e4m3x2_to_bf16(raw.word[i]), scale),
                                                  mul_bf16x2(e4m3x2_to_bf16(raw.word[i] >> 16), scale));
  }
}

template <int D>
__device__ __forceinline__ void load_kv_fp4(const uint8_t* entry, int lane, Raw<D>& raw) {
  static_assert(kv_fp4::bytes(D) % 4 == 0, "4-byte aligned entries");
#pragma unroll
  for (int i = 0; i < kKvSteps<D>; ++i) {
    const int c = 8 * lane + 256 * i;
    if (c >= D) break;
    raw.word[i] = *reinterpret_cast<const uint32_t*>(entry + c / 2);
    raw.scale[i] = entry[kv_fp4::scales_offset(D) + c / kv_fp4::kBlock];
  }
}

template <int D, class At>
__device__ __forceinline__ void decode_kv_fp4(const Raw<D>& raw, int lane, At at) {
#pragma unroll
  for (int i = 0; i < kKvSteps<D>; ++i) {
    const int c = 8 * lane + 256 * i;
    if (c >= D) break;
    // The scale's e4m3 code in both bytes: its value in both bf16 halves, by the hardware's
    // conversion (e4m3_to_float's subnormal and NaN branches took ~25 instructions a scale).
    const uint32_t scale = e4m3x2_to_bf16(raw.scale[i] * 0x101u);
    uint32_t v0, v1, v2, v3;
    e2m1x4_to_bf16<0>(raw.word[i], v0, v1);
    e2m1x4_to_bf16<1>(raw.word[i], v2, v3);
    *reinterpret_cast<uint4*>(at(c)) =
        make_uint4(mul_bf16x2(v0, scale), mul_bf16x2(v1, scale), mul_bf16x2(v2, scale), mul_bf16x2(v3, scale));
  }
}

// Step 1, decode: entries e0 .. e0 + n - 1 of token b, entry j to row_at(j) (a placement as the
// decoders take: channel c to row_at(j)(c)), whether it holds an entry to valid[j]. Warp w of
// `Warps` takes entries w, w + Warps, ...; `ring` and `cache` are the token's (cache unread, may
// be null, if K = 0). The warp loads its entries' indices at once (a lane each), then `Round`
// entries' bytes at a time, then decodes them: two memory latencies per round, not per entry.
template <int D, int Warps, int Round, class RowAt>
__device__ __forceinline__ void decode_entries(const SparseAttentionBatch& batch, int64_t b, const uint8_t* ring,
                                               const uint8_t* cache, int e0, int n, int warp, int lane, RowAt row_at,
                                               bool* valid) {
  constexpr int kPer = kTile / Warps;
  static_assert(kPer <= 32 && kPer % Round == 0, "a lane per entry of the warp");
  const int W = batch.W, K = batch.K;
  int32_t mine = -1;  // lane i: the index of the warp's entry i
  if (lane < kPer && warp + Warps * lane < n) {
    const int e = e0 + warp + Warps * lane;
    mine = e < W ? batch.window[b * W + e] : batch.topk[b * K + (e - W)];
  }
#pragma unroll
  for (int i0 = 0; i0 < kPer; i0 += Round) {
    int32_t index[Round];
    Raw<D> raw[Round];
#pragma unroll
    for (int i = 0; i < Round; ++i) {
      const int j = warp + Warps * (i0 + i), e = e0 + j;
      index[i] = __shfl_sync(0xFFFFFFFFu, mine, i0 + i);
      if (j >= n || index[i] < 0) continue;
      if (e < W) load_swa_fp8<D>(ring + int64_t(index[i]) * swa_fp8::bytes(D), lane, raw[i]);
      else load_kv_fp4<D>(cache + int64_t(index[i]) * kv_fp4::bytes(D), lane, raw[i]);
    }
#pragma unroll
    for (int i = 0; i < Round; ++i) {
      const int j = warp + Warps * (i0 + i), e = e0 + j;
      if (j >= n) continue;
      const auto at = row_at(j);
      if (index[i] < 0) {
        for (int c = lane; c < D; c += 32) *at(c) = 0;
      } else if (e < W) {
        decode_swa_fp8<D>(raw[i], lane, at);
      } else {
        decode_kv_fp4<D>(raw[i], lane, at);
      }
      if (lane == 0) valid[j] = index[i] >= 0;
    }
  }
}

// Step 1 by the block's 8 warps into a Tile. kSwizzled: rows as channel_at places them (the
// tensor-core kernel's, which holds its accumulators across the decode: half the entries in flight).
template <int D, bool kSwizzled = false>
__device__ __forceinline__ void decode_tile(const SparseAttentionBatch& batch, int64_t b, const uint8_t* ring,
                                            const uint8_t* cache, int e0, int n, Tile<D>& tile) {
  constexpr int kPer = kTile / kWarps;
  const auto row_at = [&tile](int j) {
    return [row = tile.row[j], x = kSwizzled ? j & 7 : 0](int c) { return row + channel_at(c, x); };
  };
  decode_entries<D, kWarps, kSwizzled ? kPer / 2 : kPer>(batch, b, ring, cache, e0, n, int(threadIdx.x / 32),
                                                          int(threadIdx.x % 32), row_at, tile.valid);
}

// q [G, D] of heads h0 .. h0 + G - 1 of token b into shared memory.
template <int D, int G>
__device__ __forceinline__ void load_q(const float* q, int64_t b, int H, int h0, float (&sq)[G][D]) {
#pragma unroll
  for (int i = threadIdx.x; i < G * D; i += kThreads) sq[i / D][i % D] = __ldg(q + (b * H + h0 + i / D) * D + i % D);
}

// Step 2, scores: s[g][j] = (q_g · entry j)·scale, -infinity for an empty slot. Warp w takes
// entries w, w + 8, ...; each lane holds channels lane + 32k of the entry in registers
// (conflict-free reads) and dots them with every head's; the xor tree leaves the sum in every lane.
template <int D, int G>
__device__ __forceinline__ void score_tile(const Tile<D>& tile, const float (&q)[G][D], float scale, int n,
                                           float (&s)[G][kTile]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = warp; j < n; j += kWarps) {
    constexpr int C = D / 32;
    float v[C];
#pragma unroll
    for (int k = 0; k < C; ++k) v[k] = bf16_to_float(tile.row[j][lane + 32 * k]);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float dot = 0;
#pragma unroll
      for (int k = 0; k < C; ++k) dot = fmaf(q[g][lane + 32 * k], v[k], dot);
      for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
      if (lane == 0) s[g][j] = tile.valid[j] ? dot * scale : -INFINITY;
    }
  }
}

// Step 3 is one warp per head; its lane holds the scores s0, s1 of the tile's entries lane and
// lane + 32 (-infinity past the tile's end). The tile's maximum score, in every lane:
__device__ __forceinline__ float tile_max(float s0, float s1) {
  float m = fmaxf(s0, s1);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  return m;
}

// ... and, under the running maximum `running` (which includes this tile's), the probabilities
// p0, p1 rounded to bf16 (the kernel casts p to bf16 before P·V) and their unrounded sum, the
// tile's term of the denominator, in every lane.
__device__ __forceinline__ float tile_probabilities(float s0, float s1, float running, float& p0, float& p1) {
  const float x0 = expf(s0 - running), x1 = expf(s1 - running);
  float sum = x0 + x1;
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  p0 = round_bf16(x0);
  p1 = round_bf16(x1);
  return sum;
}

// Step 3 for one head, every lane of its warp: the running maximum raised to the tile's, the
// tile's probabilities p0, p1 (as tile_probabilities), and by lane 0 the head's state in shared
// memory: its rescale for this tile, running maximum and denominator.
__device__ __forceinline__ void softmax_step(float s0, float s1, float& running_max, float& sum_exp, float& rescale,
                                             float& p0, float& p1) {
  const float previous = running_max;
  const float running = fmaxf(previous, tile_max(s0, s1));
  const float block_sum = tile_probabilities(s0, s1, running, p0, p1);
  if (threadIdx.x % 32 == 0) {
    rescale = expf(previous - running);
    running_max = running;
    sum_exp = sum_exp * rescale + block_sum;
  }
}

// Step 4, P·V in entry order: block[g] = Σ_j p[g][j]·entry j over the tile's n entries, for the
// channels 2·pair and 2·pair + 1 (pair < D/2) of every head.
template <int D, int G>
__device__ __forceinline__ void tile_pv(const Tile<D>& tile, const float (&p)[G][kTile], int n, int pair,
                                        float (&block)[G][2]) {
  static_assert(D % 64 == 0 && D / 2 <= kThreads, "a thread owns one channel pair");
#pragma unroll
  for (int g = 0; g < G; ++g) block[g][0] = block[g][1] = 0;
  for (int j = 0; j < n; ++j) {
    uint32_t v2;
    memcpy(&v2, &tile.row[j][2 * pair], 4);
    const float v0 = __uint_as_float(v2 << 16), v1 = __uint_as_float(v2 & 0xFFFF0000u);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float pg = p[g][j];
      block[g][0] += pg * v0;
      block[g][1] += pg * v1;
    }
  }
}

// ---- one block per (token, head group) ---------------------------------------------------------

template <int D, int G>
struct Smem {
  Tile<D> tile;
  float q[G][D];
  float s[G][kTile];  // scores, then bf16-rounded probabilities
  float rescale[G], running_max[G], sum_exp[G];
};

// Grid (token b, head group of G heads); the block walks all of token b's tiles, keeping the
// online softmax's state (running maximum and denominator in shared memory, the accumulator in
// registers: thread `pair` owns channels 2·pair, 2·pair + 1 of every head) across them.
// Reads the token's entries once per block (H/G blocks per token) and q [G, D]; writes out [G, D].
template <int D, int G>
__global__ void __launch_bounds__(kThreads) attention_kernel(SparseAttentionBatch batch, const float* q,
                                                             const float* sink, float scale, float* out) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Smem<D, G>& sm = *reinterpret_cast<Smem<D, G>*>(smem_bytes);
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = batch.heads, E = batch.W + batch.K;

  load_q<D, G>(q, b, H, h0, sm.q);
  if (threadIdx.x < G) sm.running_max[threadIdx.x] = kInitialMax, sm.sum_exp[threadIdx.x] = 0;
  float acc[G][2];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = 0;
  const uint8_t* ring = batch.rings[b];
  const uint8_t* cache = batch.K > 0 ? batch.caches[b] : nullptr;  // no cache list at all where K = 0
  const int pair = threadIdx.x;  // channels 2·pair, 2·pair + 1

  for (int e0 = 0; e0 < E; e0 += kTile) {
    const int n = E - e0 < kTile ? E - e0 : kTile;
    decode_tile<D>(batch, b, ring, cache, e0, n, sm.tile);
    __syncthreads();
    score_tile<D, G>(sm.tile, sm.q, scale, n, sm.s);
    __syncthreads();
    for (int g = warp; g < G; g += kWarps) {
      const float s0 = lane < n ? sm.s[g][lane] : -INFINITY, s1 = lane + 32 < n ? sm.s[g][lane + 32] : -INFINITY;
      float p0, p1;
      softmax_step(s0, s1, sm.running_max[g], sm.sum_exp[g], sm.rescale[g], p0, p1);
      __syncwarp();  // every lane has read its scores before they are overwritten
      if (lane < n) sm.s[g][lane] = p0;
      if (lane + 32 < n) sm.s[g][lane + 32] = p1;
    }
    __syncthreads();
    if (2 * pair < D) {
      float block[G][2];
      tile_pv<D, G>(sm.tile, sm.s, n, pair, block);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        acc[g][0] = acc[g][0] * sm.rescale[g] + block[g][0];
        acc[g][1] = acc[g][1] * sm.rescale[g] + block[g][1];
      }
    }
    __syncthreads();
  }
  if (2 * pair < D)
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float denominator = sm.sum_exp[g] + expf(sink[h0 + g] - sm.running_max[g]);
      float* o = out + (b * H + h0 + g) * D + 2 * pair;
      o[0] = round_bf16(acc[g][0] / denominator);
      o[1] = round_bf16(acc[g][1] / denominator);
    }
}

// ---- split over tiles ---------------------------------------------------------------------------
//
// Scratch, fp32, for R = B·H rows (token, head) and T = ⌈E/64⌉ tiles:
//   block       [R, T, D]  each tile's P·V sums (first: read as float4)
//   stats       [R, T]     each tile's (rescale, block_sum), float2
//   scores      [R, E]
//   tile_maxima [R, T]
//   last_max    [R]        the running maximum after the last tile
// 4·R·(T·D + 3·T + E + 1) bytes: 1.5 MB for V4.1 at batch 1, in L2.

// Kernel 1 of 3. Grid (token b, head group of G heads, tile t): decodes tile t of token b, scores
// the G heads against it (step 2), writes the scores scores[b, h, e0 .. e0 + n) and the tile's
// maximum score tile_maxima[b, h, t] (of step 3).
// Reads the tile's entries (64·528 or 64·288 bytes at dim 512; from memory once, from L2 for the
// other H/G - 1 head groups) and q [G, D]; writes G·(n + 1) floats.
template <int D, int G>
struct ScoreSmem {
  Tile<D> tile;
  float q[G][D];
  float s[G][kTile];
};

template <int D, int G>
__global__ void __launch_bounds__(kThreads) split_scores_kernel(SparseAttentionBatch batch, const float* q, float scale,
                                                                float* scores, float* tile_maxima) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  ScoreSmem<D, G>& sm = *reinterpret_cast<ScoreSmem<D, G>*>(smem_bytes);
  wait_for_inputs();
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * G, t = blockIdx.z, T = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = batch.heads, E = batch.W + batch.K, e0 = t * kTile, n = E - e0 < kTile ? E - e0 : kTile;

  load_q<D, G>(q, b, H, h0, sm.q);
  decode_tile<D>(batch, b, batch.rings[b], batch.K > 0 ? batch.caches[b] : nullptr, e0, n, sm.tile);
  __syncthreads();
  score_tile<D, G>(sm.tile, sm.q, scale, n, sm.s);
  __syncthreads();
  for (int g = warp; g < G; g += kWarps) {
    const int64_t r = b * H + h0 + g;
    const float s0 = lane < n ? sm.s[g][lane] : -INFINITY, s1 = lane + 32 < n ? sm.s[g][lane + 32] : -INFINITY;
    float* row = scores + r * E + e0;
    if (lane < n) row[lane] = s0;
    if (lane + 32 < n) row[lane + 32] = s1;
    const float m = tile_max(s0, s1);
    if (lane == 0) tile_maxima[r * T + t] = m;
  }
}

// A head's running maximum before and after tile t: fmaxf(previous, tile maximum) over tiles 0 .. t
// in order, as attention_kernel does, from `maxima` (the head's row of the tiles' maxima), in every
// lane of the warp; it loads 32 maxima at a time and broadcasts them one by one.
__device__ __forceinline__ void running_maxima(const float* maxima, int t, int lane, float& previous, float& running) {
  previous = running = kInitialMax;
  for (int u0 = 0; u0 <= t; u0 += 32) {
    const float m = u0 + lane <= t ? maxima[u0 + lane] : 0.0f;
    for (int u = u0; u <= t && u < u0 + 32; ++u) {
      previous = running;
      running = fmaxf(previous, __shfl_sync(0xFFFFFFFFu, m, u - u0));
    }
  }
}

// Kernel 2's step 3 for row r (a token's head) at tile t, in every lane of its warp: the running
// maximum over the tiles' maxima, the tile's probabilities p0, p1 of entries lane and lane + 32 (0
// past n), and by lane 0 the tile's (rescale, block_sum) and, at the last tile, the row's maximum.
__device__ __forceinline__ void split_probabilities(const float* scores, const float* tile_maxima, int64_t r, int E,
                                                    int T, int t, int n, int lane, float2* stats, float* last_max,
                                                    float& p0, float& p1) {
  float previous, running;
  running_maxima(tile_maxima + r * T, t, lane, previous, running);
  const float* row = scores + r * E + int64_t(t) * kTile;
  const float s0 = lane < n ? row[lane] : -INFINITY, s1 = lane + 32 < n ? row[lane + 32] : -INFINITY;
  const float block_sum = tile_probabilities(s0, s1, running, p0, p1);
  if (lane == 0) {
    stats[r * T + t] = make_float2(expf(previous - running), block_sum);
    if (t == T - 1) last_max[r] = running;
  }
}

// Kernel 2 of 3. Grid (token b, head group of G heads, tile t), after kernel 1: per head, the
// running maximum before and after tile t (attention_kernel's recurrence over the maxima of
// tiles 0 .. t), the tile's probabilities and block_sum (step 3); decodes tile t again and forms
// its P·V sums (step 4). Writes block[b, h, t, :], stats[b, h, t] = (rescale, block_sum) and, from
// the last tile, last_max[b, h].
// Reads the tile's entries, G·(n + t + 1) floats of scores and maxima; writes G·(D + 2) floats.
template <int D, int G>
struct PvSmem {
  Tile<D> tile;
  float p[G][kTile];  // bf16-rounded probabilities
};

template <int D, int G>
__global__ void __launch_bounds__(kThreads) split_pv_kernel(SparseAttentionBatch batch, const float* scores,
                                                            const float* tile_maxima, float* block, float2* stats,
                                                            float* last_max) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  PvSmem<D, G>& sm = *reinterpret_cast<PvSmem<D, G>*>(smem_bytes);
  wait_for_inputs();
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * G, t = blockIdx.z, T = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = batch.heads, E = batch.W + batch.K, e0 = t * kTile, n = E - e0 < kTile ? E - e0 : kTile;

  decode_tile<D>(batch, b, batch.rings[b], batch.K > 0 ? batch.caches[b] : nullptr, e0, n, sm.tile);
  for (int g = warp; g < G; g += kWarps) {
    const int64_t r = b * H + h0 + g;
    float p0, p1;
    split_probabilities(scores, tile_maxima, r, E, T, t, n, lane, stats, last_max, p0, p1);
    if (lane < n) sm.p[g][lane] = p0;
    if (lane + 32 < n) sm.p[g][lane + 32] = p1;
  }
  __syncthreads();
  const int pair = threadIdx.x;  // channels 2·pair, 2·pair + 1
  if (2 * pair < D) {
    float sums[G][2];
    tile_pv<D, G>(sm.tile, sm.p, n, pair, sums);
#pragma unroll
    for (int g = 0; g < G; ++g)
      *reinterpret_cast<float2*>(block + ((b * H + h0 + g) * T + t) * D + 2 * pair) = make_float2(sums[g][0], sums[g][1]);
  }
}

// Kernel 3 of 3. One thread per (row r = (token, head), 4 channels), after kernel 2: the online
// softmax's recurrence over the tiles in order from zero, acc = acc·rescale_t + block_t and
// sum_exp = sum_exp·rescale_t + block_sum_t (attention_kernel's fp32 operations; every thread of a
// row repeats the denominator's, T steps), then the sink and the bf16 output.
// Reads block [R, T, D] and stats, 4·R·T·(D + 2) bytes (1.3 MB for V4.1 at batch 1, from L2);
// writes out [R, D].
constexpr int kCombineThreads = 128;

template <int D>
__global__ void __launch_bounds__(kCombineThreads) split_combine_kernel(const float* block, const float2* stats,
                                                                        const float* last_max, const float* sink,
                                                                        int64_t rows, int H, int T, float* out) {
  constexpr int kQuads = D / 4;
  wait_for_inputs();
  const int64_t i = int64_t(blockIdx.x) * kCombineThreads + threadIdx.x;
  if (i >= rows * kQuads) return;
  const int64_t r = i / kQuads;
  const int c = int(i % kQuads) * 4;
  float4 acc = make_float4(0, 0, 0, 0);
  float sum_exp = 0;
  for (int t = 0; t < T; ++t) {
    const float2 st = stats[r * T + t];  // (rescale, block_sum)
    const float4 v = *reinterpret_cast<const float4*>(block + (r * T + t) * D + c);
    acc.x = acc.x * st.x + v.x;
    acc.y = acc.y * st.x + v.y;
    acc.z = acc.z * st.x + v.z;
    acc.w = acc.w * st.x + v.w;
    sum_exp = sum_exp * st.x + st.y;
  }
  const float denominator = sum_exp + expf(sink[r % H] - last_max[r]);
  float* o = out + r * D + c;  // scalar stores: `out` need not be 16-byte aligned
  o[0] = round_bf16(acc.x / denominator);
  o[1] = round_bf16(acc.y / denominator);
  o[2] = round_bf16(acc.z / denominator);
  o[3] = round_bf16(acc.w / denominator);
}

// ---- on the tensor cores: one block per (token, 32 heads) ----------------------------------------
//
// Many tokens at once (prefill, large decode batches): a token's heads share each entry (one KV
// vector per position), so per tile the scores are a small GEMM, S [32 heads, 64 entries] =
// Q [32, D] · tileᵀ, and so is P·V, O [32, D] += P [32, 64] · tile [64, D] — both bf16 mma.sync
// with fp32 accumulation, the tile in shared memory once for both (ldmatrix for S, ldmatrix.trans
// for P·V). The softmax step between them is attention_kernel's (tile_max, tile_probabilities, the
// same running maximum), one warp per head. Rounding differs from the CUDA-core paths only in the
// fp32 sums: the tensor cores align and truncate (ops_attention_test states the bound), and O is
// rescaled before the tile's products are added to it, where the other paths add a separate block
// sum. 8 warps: for S, warp w takes heads 16·(w/4).. and entries 16·(w%4)..; for P·V, channels
// 64w .. 64w + 63 of all 32 heads (64 fp32 accumulators a thread, in registers across the tiles).
// Shared memory: Q 32·D·2 (32 KB at D = 512), the tile 64·D·2 (64 KB), S 8 KB, P 4 KB: two blocks
// per SM. Reads a token's entries once per 32 heads (twice for V4.1's 64) and q; writes out.
constexpr int kMmaHeads = 32;

template <int D>
struct MmaSmem {
  Tile<D> tile;                          // swizzled rows (decode_tile<D, true>)
  alignas(16) uint16_t q[kMmaHeads][D];  // bf16, swizzled as the tile's rows
  float s[kMmaHeads][kTile + 1];         // scores (padded: the fragment stores' rows fall into distinct banks)
  alignas(16) uint16_t p[kMmaHeads][kTile];  // bf16 probabilities, each row's 8 chunks swizzled
  float rescale[kMmaHeads], running_max[kMmaHeads], sum_exp[kMmaHeads];
};

// The shared-memory address of channel chunk c (8 bf16) of a swizzled row r of `width` channels.
__device__ __forceinline__ uint32_t chunk_address(const uint16_t* base, int width, int r, int c) {
  return ptx::smem_addr(base + r * width + channel_at(8 * c, r & 7));
}

// q [32, D] of heads h0 .. of token b as bf16 (exact: q holds bf16 values), swizzled as the tile's rows.
template <int D>
__device__ __forceinline__ void load_q_bf16(const float* q, int64_t b, int H, int h0, uint16_t (&sq)[kMmaHeads][D]) {
  for (int i = threadIdx.x; i < kMmaHeads * D / 4; i += kThreads) {
    const int h = i / (D / 4), c = i % (D / 4) * 4;
    const float4 v = __ldg(reinterpret_cast<const float4*>(q + (b * H + h0 + h) * D + c));
    *reinterpret_cast<uint2*>(&sq[h][channel_at(c, h & 7)]) = make_uint2(bf16_pair(v.x, v.y), bf16_pair(v.z, v.w));
  }
}

// Rows n .. 63 of a decoded tile take part in the products (with p = 0): zeros, not stale bytes.
template <int D>
__device__ __forceinline__ void zero_tail(Tile<D>& tile, int n) {
  for (int i = threadIdx.x; i < (kTile - n) * D / 8; i += kThreads)
    *reinterpret_cast<uint4*>(&tile.row[n + i / (D / 8)][i % (D / 8) * 8]) = make_uint4(0, 0, 0, 0);
}

// S = Q·tileᵀ·scale into s, -infinity for an empty slot or past n. Warp w: heads 16·(w/4) .. + 15
// (one m16 tile), entries 16·(w%4) .. + 15 (two n8 tiles).
template <int D>
__device__ __forceinline__ void mma_scores(const Tile<D>& tile, const uint16_t (&q)[kMmaHeads][D], float scale, int n,
                                           float (&s)[kMmaHeads][kTile + 1]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int hm = 16 * (warp / 4), en = 16 * (warp % 4);
  float acc[2][4] = {};
#pragma unroll 8
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4], r[4];
    ptx::ldmatrix_x4(a, chunk_address(&q[0][0], D, hm + lane % 16, 2 * kk + lane / 16));
    ptx::ldmatrix_x4(r, chunk_address(&tile.row[0][0], D, en + lane / 16 * 8 + lane % 8, 2 * kk + lane / 8 % 2));
    ptx::mma_bf16(acc[0], a, r[0], r[1]);
    ptx::mma_bf16(acc[1], a, r[2], r[3]);
  }
#pragma unroll
  for (int nt = 0; nt < 2; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = hm + g + 8 * (e / 2), j = en + 8 * nt + 2 * t + e % 2;
      s[h][j] = tile.valid[j] && j < n ? acc[nt][e] * scale : -INFINITY;
    }
}

// O += P·tile: warp w, channels 64w .. 64w + 63 (8 n8 tiles) of the 32 heads (two m16 tiles); p the
// bf16 probabilities [32 heads][64 entries], each row's 8 chunks swizzled.
template <int D>
__device__ __forceinline__ void mma_pv(const Tile<D>& tile, const uint16_t (&p)[kMmaHeads][kTile], float (&o)[2][8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (64 * warp >= D) return;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    uint32_t a[2][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) ptx::ldmatrix_x4(a[mt], chunk_address(&p[0][0], kTile, 16 * mt + lane % 16, 2 * kk + lane / 16));
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      // Matrices (entries 16kk + 0-7 | 8-15) × (channel chunks 8w + 2np | 8w + 2np + 1), transposed.
      uint32_t r[4];
      ptx::ldmatrix_x4_trans(r, chunk_address(&tile.row[0][0], D, 16 * kk + lane / 8 % 2 * 8 + lane % 8, 8 * warp + 2 * np + lane / 16));
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        ptx::mma_bf16(o[mt][2 * np], a[mt], r[0], r[1]);
        ptx::mma_bf16(o[mt][2 * np + 1], a[mt], r[2], r[3]);
      }
    }
  }
}

// Each pair of the thread's accumulators in mma_pv's o as f(head h, channel c, o[h][c], o[h][c + 1]):
// rows g and g + 8 of each m16 tile, channels 64w + 8nt + 2·(lane % 4) of each n8 tile.
template <int D, class F>
__device__ __forceinline__ void for_o_pairs(const float (&o)[2][8][4], F f) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  if (64 * warp >= D) return;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) f(16 * mt + g + 8 * half, 64 * warp + 8 * nt + 2 * t, o[mt][nt][2 * half], o[mt][nt][2 * half + 1]);
}

// Head h's probabilities p0, p1 (entries lane, lane + 32) as bf16 into its swizzled row of p.
__device__ __forceinline__ void store_p(uint16_t* row, int h, int lane, float p0, float p1) {
  row[channel_at(lane, h & 7)] = uint16_t(float_bits(p0) >> 16);  // exact: p0 is bf16
  row[channel_at(lane + 32, h & 7)] = uint16_t(float_bits(p1) >> 16);
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2) mma_attention_kernel(SparseAttentionBatch batch, const float* q,
                                                                     const float* sink, float scale, float* out) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  MmaSmem<D>& sm = *reinterpret_cast<MmaSmem<D>*>(smem_bytes);
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * kMmaHeads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int H = batch.heads, E = batch.W + batch.K;

  load_q_bf16<D>(q, b, H, h0, sm.q);
  if (threadIdx.x < kMmaHeads) sm.running_max[threadIdx.x] = kInitialMax, sm.sum_exp[threadIdx.x] = 0;
  float o[2][8][4] = {};  // [m16 tile][n8 tile of this warp's 64 channels][fragment]
  const uint8_t* ring = batch.rings[b];
  const uint8_t* cache = batch.K > 0 ? batch.caches[b] : nullptr;

  for (int e0 = 0; e0 < E; e0 += kTile) {
    const int n = E - e0 < kTile ? E - e0 : kTile;
    decode_tile<D, true>(batch, b, ring, cache, e0, n, sm.tile);
    zero_tail<D>(sm.tile, n);
    __syncthreads();
    mma_scores<D>(sm.tile, sm.q, scale, n, sm.s);
    __syncthreads();

    // The softmax step, one warp per head (attention_kernel's), P as bf16 into its swizzled rows.
    for (int h = warp; h < kMmaHeads; h += kWarps) {
      const float s0 = sm.s[h][lane], s1 = sm.s[h][lane + 32];
      float p0, p1;
      softmax_step(s0, s1, sm.running_max[h], sm.sum_exp[h], sm.rescale[h], p0, p1);
      store_p(sm.p[h], h, lane, p0, p1);
    }
    __syncthreads();

    // O rescaled to the new maximum, then the tile's P·V added to it.
    if (64 * warp < D)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const float r0 = sm.rescale[16 * mt + g], r1 = sm.rescale[16 * mt + g + 8];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) o[mt][nt][0] *= r0, o[mt][nt][1] *= r0, o[mt][nt][2] *= r1, o[mt][nt][3] *= r1;
      }
    mma_pv<D>(sm.tile, sm.p, o);
    __syncthreads();  // the tile, S and P are rewritten by the next tile
  }

  for_o_pairs<D>(o, [&](int h, int c, float v0, float v1) {
    const float denominator = sm.sum_exp[h] + expf(sink[h0 + h] - sm.running_max[h]);
    *reinterpret_cast<float2*>(out + (b * H + h0 + h) * D + c) =
        make_float2(round_bf16(v0 / denominator), round_bf16(v1 / denominator));
  });
}

// ---- split over tiles on the tensor cores --------------------------------------------------------
//
// [split_mma_scores_kernel, split_mma_pv_kernel] The split path's kernels 1 and 2 with the
// tensor-core kernel's products: a block per (token, 32 heads, tile), so a small decode batch
// (which gives the one-block kernels a block per token and head group, each walking its 10 tiles in
// sequence) spreads over T times the blocks. They write the split path's scratch (scores, the
// tiles' maxima, each tile's block of P·V sums and its (rescale, block_sum)), and
// split_combine_kernel ends the call. Rounding as mma_attention_kernel's, except that a tile's P·V
// is summed from zero and added to the rescaled accumulator by the combine, where the one-block
// kernel accumulates it onto the rescaled O inside the MMA. Shared memory: the tile and Q (105 KB
// with S, two blocks an SM) for the scores, the tile and P (68 KB, three) for P·V.
template <int D>
struct SplitMmaScoreSmem {
  Tile<D> tile;
  alignas(16) uint16_t q[kMmaHeads][D];
  float s[kMmaHeads][kTile + 1];
};

template <int D>
__global__ void __launch_bounds__(kThreads, 2) split_mma_scores_kernel(SparseAttentionBatch batch, const float* q,
                                                                        float scale, float* scores, float* tile_maxima) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  SplitMmaScoreSmem<D>& sm = *reinterpret_cast<SplitMmaScoreSmem<D>*>(smem_bytes);
  wait_for_inputs();
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * kMmaHeads, t = blockIdx.z, T = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = batch.heads, E = batch.W + batch.K, e0 = t * kTile, n = E - e0 < kTile ? E - e0 : kTile;

  load_q_bf16<D>(q, b, H, h0, sm.q);
  decode_tile<D, true>(batch, b, batch.rings[b], batch.K > 0 ? batch.caches[b] : nullptr, e0, n, sm.tile);
  zero_tail<D>(sm.tile, n);
  __syncthreads();
  mma_scores<D>(sm.tile, sm.q, scale, n, sm.s);
  __syncthreads();
  for (int h = warp; h < kMmaHeads; h += kWarps) {
    const int64_t r = b * H + h0 + h;
    const float s0 = sm.s[h][lane], s1 = sm.s[h][lane + 32];
    float* row = scores + r * E + e0;
    if (lane < n) row[lane] = s0;
    if (lane + 32 < n) row[lane + 32] = s1;
    const float m = tile_max(s0, s1);
    if (lane == 0) tile_maxima[r * T + t] = m;
  }
}

template <int D>
struct SplitMmaPvSmem {
  Tile<D> tile;
  alignas(16) uint16_t p[kMmaHeads][kTile];
};

template <int D>
__global__ void __launch_bounds__(kThreads, 2) split_mma_pv_kernel(SparseAttentionBatch batch, const float* scores,
                                                                    const float* tile_maxima, float* block, float2* stats,
                                                                    float* last_max) {
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  SplitMmaPvSmem<D>& sm = *reinterpret_cast<SplitMmaPvSmem<D>*>(smem_bytes);
  wait_for_inputs();
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * kMmaHeads, t = blockIdx.z, T = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = batch.heads, E = batch.W + batch.K, e0 = t * kTile, n = E - e0 < kTile ? E - e0 : kTile;

  decode_tile<D, true>(batch, b, batch.rings[b], batch.K > 0 ? batch.caches[b] : nullptr, e0, n, sm.tile);
  zero_tail<D>(sm.tile, n);
  for (int h = warp; h < kMmaHeads; h += kWarps) {
    const int64_t r = b * H + h0 + h;
    float p0, p1;
    split_probabilities(scores, tile_maxima, r, E, T, t, n, lane, stats, last_max, p0, p1);
    store_p(sm.p[h], h, lane, p0, p1);
  }
  __syncthreads();
  float o[2][8][4] = {};
  mma_pv<D>(sm.tile, sm.p, o);
  for_o_pairs<D>(o, [&](int h, int c, float v0, float v1) {
    *reinterpret_cast<float2*>(block + ((b * H + h0 + h) * T + t) * D + c) = make_float2(v0, v1);
  });
}

// ---- one block per token on the warpgroup MMA (decode batches, prefill) -------------------------
//
// [wgmma_attention_kernel] For calls of 8 tokens or more (decode batches, prefill chunks): one block per (token, 64
// heads), two warpgroups. A tile's entries are gathered two tiles ahead by cp.async, as stored,
// into a staging ring, so the memory's latency runs beside the MMAs of the tiles before; each tile
// is then decoded from the staging into bf16 and taken through the CPU op's steps:
//   S = Q·Tᵀ   wgmma m64n32k16 × 32 (K = 512 channels): warpgroup c the tile's entries 32c .. 32c + 31;
//   softmax    the tile's maximum per head from both halves (exchanged in shared memory), the
//              running maximum, p = bf16(exp(s − m)) into P [64 heads, 64 entries], and each
//              warpgroup's half of the denominator, rescaled as the accumulator is;
//   O += P·T   after O is rescaled, wgmma m64n256k16 × 4 (K = 64 entries): warpgroup c channels
//              256c .. 256c + 255, T read N-major from the same tile (mnmajor_sw128).
// Rounding as mma_attention_kernel: fp32 sums in the MMA's order, and the denominator is the two
// halves' sums, added at the end. The accumulators of O take 128 registers a thread: the block has
// no producer warps, whose registers the consumers would lose (ptxas allots every warp alike).
// Shared memory, Q, the tile and P in swizzled 128B panels of 64 channels (wgmma's layout): Q 64
// KB, the tile 64 KB, P 8 KB, the staging 2 × 64 × 528 bytes: one block per SM. Reads a token's
// entries once for its 64 heads, q, and writes out.
constexpr int kWgHeads = 64;           // the MMAs' M
constexpr int kWgThreads = 256;
constexpr int kWgWarps = kWgThreads / 32;
constexpr int kPanelBytes = 64 * 128;  // [64 rows][64 bf16]: a panel of Q, of the tile, and P
static_assert(kWgHeads == kTile, "Q's panels and the tile's have one size");

// Element (r, c) of a panel, c < 64: row r's 16-byte chunks XORed by r's low 3 bits (swizzle 128B).
__device__ __forceinline__ int panel_at(int r, int c) { return r * 64 + ((((c >> 3) ^ r) & 7) << 3) + (c & 7); }

template <int D>
struct WgSmem {
  static constexpr int kEntryBytes = swa_fp8::bytes(D) > kv_fp4::bytes(D) ? swa_fp8::bytes(D) : kv_fp4::bytes(D);
  static_assert(swa_fp8::bytes(D) % 16 == 0 && kv_fp4::bytes(D) % 16 == 0, "entries of whole 16-byte chunks");
  uint16_t q[D / 64][kWgHeads * 64];  // panel p: channels 64p .. of the 64 heads
  uint16_t tile[D / 64][kTile * 64];  // panel p: channels 64p .. of the 64 entries
  uint16_t p[kWgHeads * kTile];       // [64 heads][64 entries]
  uint8_t staged[2][kTile][kEntryBytes];
  int32_t index[2][kTile];  // of each staged entry, -1 for none
  float half_max[2][kWgHeads], half_sum[2][kWgHeads];
  bool valid[kTile];
};

// The index of entry e0 + j of token b (-1 past the n of its tile).
__device__ __forceinline__ int32_t entry_index(const SparseAttentionBatch& batch, int64_t b, int e0, int n, int j) {
  if (j >= n) return -1;
  const int e = e0 + j;
  return e < batch.W ? batch.window[b * batch.W + e] : batch.topk[b * batch.K + (e - batch.W)];
}

// cp.async of entry j = tid/4 of the tile at e0 (index idx) into staging buffer s, four threads
// an entry; one commit group per call on every thread.
template <int D>
__device__ __forceinline__ void stage_tile(const SparseAttentionBatch& batch, const uint8_t* ring, const uint8_t* cache,
                                           int e0, int32_t idx, WgSmem<D>& sm, int s) {
  const int j = threadIdx.x / 4, part = threadIdx.x % 4;
  if (part == 0) sm.index[s][j] = idx;
  if (idx >= 0) {
    const bool swa = e0 + j < batch.W;
    const int bytes = swa ? swa_fp8::bytes(D) : kv_fp4::bytes(D);
    const uint8_t* src = swa ? ring + int64_t(idx) * swa_fp8::bytes(D) : cache + int64_t(idx) * kv_fp4::bytes(D);
    for (int c = 16 * part; c < bytes; c += 64) ptx::cp_async16(ptx::smem_addr(&sm.staged[s][j][c]), src + c, true);
  }
  ptx::cp_async_commit();
}

// The decode of a staged tile whose entries are all of one kind (kSwa: window entries, SWA-FP8;
// else compressed, KV-FP4) into the bf16 tile: warp `warp8` takes entries warp8, warp8 + 8, ...,
// kRound at a time, their staged bytes read before any is decoded (Nsight Compute: the decode was
// ~47% of the kernel's instructions, ~30 of a KV-FP4 entry's ~140 a lane its loop's index load,
// tests and branches, each entry's chain waited for alone). An empty slot (or one past the
// tile's n) is decoded from masked bytes: +0 codes times a finite scale (ue8m0 2^0, e4m3 +0) give
// the +0 row the mixed-tile path writes, bit for bit.
template <int D, bool kSwa>
__device__ __forceinline__ void decode_uniform_tile(WgSmem<D>& sm, int s, int n, int warp8, int lane) {
  constexpr int kRound = kSwa ? 2 : 4, kSteps = kSwa ? kSwaSteps<D> : kKvSteps<D>;
  constexpr uint32_t kEmptyScale = kSwa ? 127u : 0u;
#pragma unroll
  for (int q0 = 0; q0 < kTile / kWgWarps; q0 += kRound) {
    Raw<D> raw[kRound];
    bool live[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int j = warp8 + kWgWarps * (q0 + u);
      live[u] = j < n && sm.index[s][j] >= 0;
      if constexpr (kSwa) load_swa_fp8<D>(sm.staged[s][j], lane, raw[u]);
      else load_kv_fp4<D>(sm.staged[s][j], lane, raw[u]);
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int j = warp8 + kWgWarps * (q0 + u);
#pragma unroll
      for (int k = 0; k < kSteps; ++k)
        raw[u].word[k] = live[u] ? raw[u].word[k] : 0u, raw[u].scale[k] = live[u] ? raw[u].scale[k] : kEmptyScale;
      const auto at = [&sm, j](int c) { return &sm.tile[c / 64][panel_at(j, c % 64)]; };
      if constexpr (kSwa) decode_swa_fp8<D>(raw[u], lane, at);
      else decode_kv_fp4<D>(raw[u], lane, at);
      if (lane == 0) sm.valid[j] = live[u];
    }
  }
}

template <int D>
__global__ void __launch_bounds__(kWgThreads, 1) wgmma_attention_kernel(SparseAttentionBatch batch, const float* q,
                                                                         const float* sink, float scale, float* out) {
  static_assert(D == 512, "two warpgroups of 256 channels each");
  using namespace hopper;
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  const uint32_t base = ptx::smem_addr(smem_bytes);
  WgSmem<D>& sm = *reinterpret_cast<WgSmem<D>*>(smem_bytes + (((base + 1023) & ~1023u) - base));  // the swizzle's alignment
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * kWgHeads;
  const int H = batch.heads, E = batch.W + batch.K, T = (E + kTile - 1) / kTile;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int warp8 = tid / 32;  // of the block's kWgWarps
  const uint8_t* ring = batch.rings[b];
  const uint8_t* cache = batch.K > 0 ? batch.caches[b] : nullptr;
  const auto tile_n = [E](int i) { return E - i * kTile < kTile ? E - i * kTile : kTile; };

  // Tiles 0 and 1 on their way, then q [64 heads, D] as bf16 (exact: q holds bf16 values).
  for (int i = 0; i < 2; ++i)
    stage_tile<D>(batch, ring, cache, i * kTile, i < T ? entry_index(batch, b, i * kTile, tile_n(i), tid / 4) : -1, sm, i);
  // q's 128 KB in two rounds of 16 loads a thread, all in flight before any is stored (a load,
  // convert and store at a time left each round trip exposed: ~10% of the kernel's stall samples).
  constexpr int kQLoads = kWgHeads * D / 4 / kWgThreads, kQRound = 16;
  static_assert(kQLoads % kQRound == 0, "whole rounds");
#pragma unroll
  for (int k0 = 0; k0 < kQLoads; k0 += kQRound) {
    float4 v[kQRound];
#pragma unroll
    for (int u = 0; u < kQRound; ++u) {
      const int k = tid + (k0 + u) * kWgThreads, h = k / (D / 4), c = k % (D / 4) * 4;
      v[u] = __ldg(reinterpret_cast<const float4*>(q + (b * H + h0 + h) * D + c));
    }
#pragma unroll
    for (int u = 0; u < kQRound; ++u) {
      const int k = tid + (k0 + u) * kWgThreads, h = k / (D / 4), c = k % (D / 4) * 4;
      *reinterpret_cast<uint2*>(&sm.q[c / 64][panel_at(h, c % 64)]) =
          make_uint2(bf16_pair(v[u].x, v[u].y), bf16_pair(v[u].z, v[u].w));
    }
  }

  // This thread's heads: 16·warp + g + 8r (r = 0, 1), the rows of its accumulators' fragments.
  float o[128];  // channels 256·wg + 8k + 2t (+1) at o[4k + 2r (+1)]
#pragma unroll
  for (int k = 0; k < 128; ++k) o[k] = 0;
  keep(o);
  float m[2] = {kInitialMax, kInitialMax}, l[2] = {0, 0};  // running maximum, this half's denominator
  // The MMAs' descriptors: each k16 step's is its base's plus the step's byte offset / 16 (shared
  // memory addresses stay below 256 KB, so the 14-bit address field never carries).
  const uint32_t t0 = ptx::smem_addr(&sm.tile[0][0]);
  const uint64_t q_desc = kmajor_sw128(ptx::smem_addr(&sm.q[0][0])), t_desc = kmajor_sw128(t0 + wg * 32 * 128),
                 p_desc = kmajor_sw128(ptx::smem_addr(sm.p)),
                 v_desc = mnmajor_sw128(t0 + wg * 4 * kPanelBytes, kPanelBytes);

  for (int i = 0; i < T; ++i) {
    const int s = i % 2, e0 = i * kTile, n = tile_n(i);
    // The index of this thread's entry two tiles on: its load runs beside this tile's work.
    const int32_t next = i + 2 < T ? entry_index(batch, b, e0 + 2 * kTile, tile_n(i + 2), tid / 4) : -1;
    ptx::cp_async_wait<1>();  // tile i staged (tile i + 1 may still be on its way)
    __syncthreads();

    // Decode: warp w (of 8) entries w, w + 8, ...; rows past the tile's end and empty slots zero
    // (they take part in P·V with p = 0). A tile of one kind of entry (every tile but one that
    // straddles the window's end) takes the branch-free rounds of decode_uniform_tile.
    if (e0 >= batch.W) {
      decode_uniform_tile<D, false>(sm, s, n, warp8, lane);
    } else if (e0 + kTile <= batch.W) {
      decode_uniform_tile<D, true>(sm, s, n, warp8, lane);
    } else {
      for (int j = warp8; j < kTile; j += kWgWarps) {
        const int32_t idx = j < n ? sm.index[s][j] : -1;
        const auto at = [&sm, j](int c) { return &sm.tile[c / 64][panel_at(j, c % 64)]; };
        Raw<D> raw;
        if (idx < 0) {
          for (int c = 4 * lane; c < D; c += 128) *reinterpret_cast<uint2*>(at(c)) = make_uint2(0, 0);
        } else if (e0 + j < batch.W) {
          load_swa_fp8<D>(sm.staged[s][j], lane, raw);
          decode_swa_fp8<D>(raw, lane, at);
        } else {
          load_kv_fp4<D>(sm.staged[s][j], lane, raw);
          decode_kv_fp4<D>(raw, lane, at);
        }
        if (lane == 0) sm.valid[j] = idx >= 0;
      }
    }
    fence_proxy_async();
    __syncthreads();
    stage_tile<D>(batch, ring, cache, e0 + 2 * kTile, next, sm, s);  // its buffer is free: tile i is decoded

    // S [64 heads, this half's 32 entries]: entry 32·wg + 8k + 2t (+1) at sc[4k + 2r (+1)].
    float sc[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) sc[k] = 0;
    keep(sc);
    mma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint32_t at = (kk / 4) * kPanelBytes + (kk % 4) * 32;  // panel kk/4, its k16 step
      mma_ss<32>(sc, q_desc + at / 16, t_desc + at / 16);
    }
    mma_commit();
    mma_wait<0>();
    keep(sc);

    // The softmax step: scores scaled, -infinity where no entry; the tile's maximum per head.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool live = sm.valid[32 * wg + 8 * k + 2 * t + e];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float& v = sc[4 * k + 2 * r + e];
          v = live ? v * scale : -INFINITY;
          mx[r] = fmaxf(mx[r], v);
        }
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xFFFFFFFFu, mx[r], 2));
      if (t == 0) sm.half_max[wg][16 * warp + g + 8 * r] = mx[r];
    }
    __syncthreads();
    float rescale[2], sum[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * warp + g + 8 * r;
      const float running = fmaxf(m[r], fmaxf(sm.half_max[0][h], sm.half_max[1][h]));
      rescale[r] = expf(m[r] - running);
      m[r] = running;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float x0 = expf(sc[4 * k + 2 * r] - running), x1 = expf(sc[4 * k + 2 * r + 1] - running);
        sum[r] += x0 + x1;
        *reinterpret_cast<uint32_t*>(&sm.p[panel_at(h, 32 * wg + 8 * k + 2 * t)]) =
            bf16_pair(round_bf16(x0), round_bf16(x1));
      }
      sum[r] += __shfl_xor_sync(0xFFFFFFFFu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xFFFFFFFFu, sum[r], 2);
      l[r] = l[r] * rescale[r] + sum[r];
    }
    fence_proxy_async();
    __syncthreads();  // both halves of P written; both read half_max before the next tile rewrites it

    // A running maximum that did not move gives rescale = expf(0) = 1 exactly, and o · 1 = o: the
    // 128 multiplies are skipped, with the same bits.
    if (rescale[0] != 1.0f || rescale[1] != 1.0f) {
#pragma unroll
      for (int k = 0; k < 32; ++k) {
        o[4 * k] *= rescale[0], o[4 * k + 1] *= rescale[0];
        o[4 * k + 2] *= rescale[1], o[4 * k + 3] *= rescale[1];
      }
    }
    mma_fence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) mma_ss_tb<256>(o, p_desc + kk * 32 / 16, v_desc + kk * 16 * 128 / 16);
    mma_commit();
    mma_wait<0>();  // the tile, P and valid are rewritten by the next tile
    keep(o);
  }

#pragma unroll
  for (int r = 0; r < 2; ++r)
    if (t == 0) sm.half_sum[wg][16 * warp + g + 8 * r] = l[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = 16 * warp + g + 8 * r;
    const float denominator = sm.half_sum[0][h] + sm.half_sum[1][h] + expf(sink[h0 + h] - m[r]);
    float* row = out + (b * H + h0 + h) * D + 256 * wg + 2 * t;
#pragma unroll
    for (int k = 0; k < 32; ++k)
      *reinterpret_cast<float2*>(row + 8 * k) =
          make_float2(round_bf16(o[4 * k + 2 * r] / denominator), round_bf16(o[4 * k + 2 * r + 1] / denominator));
  }
}

// ---- host ---------------------------------------------------------------------------------------

template <int D, int G>
void launch(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
            cudaStream_t stream) {
  const size_t smem = sizeof(Smem<D, G>);
  check(cudaFuncSetAttribute(attention_kernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
        "cuda::sparse_attention");
  attention_kernel<D, G><<<dim3(unsigned(batch.tokens), unsigned(batch.heads / G)), kThreads, smem, stream>>>(
      batch, q, sink, scale, out);
  check_launch("cuda::sparse_attention");
}

// The split path's scratch, from cudaMallocAsync on the stream (no host synchronization, so a CUDA
// graph can capture the call): each tile's block of P·V sums [R, T, D] and (rescale, block_sum)
// [R, T], the scores [R, E], the tiles' maxima [R, T] and each row's last maximum [R], R = tokens · H.
struct SplitScratch {
  int T;
  int64_t rows;
  float* block;  // at the allocation's start (aligned for any type): kernel 3 loads float4
  float2* stats;
  float *scores, *tile_maxima, *last_max;
};

SplitScratch split_scratch(const SparseAttentionBatch& batch, int D, cudaStream_t stream) {
  const int H = batch.heads, E = batch.W + batch.K, T = (E + kTile - 1) / kTile;
  if (T > 65535) fail("cuda::sparse_attention", "at most 65535 tiles (gridDim.z)", std::to_string(T));
  const int64_t rows = batch.tokens * H;
  const size_t block_floats = size_t(rows) * T * D, stat_floats = size_t(rows) * T * 2, score_floats = size_t(rows) * E,
               max_floats = size_t(rows) * T;
  keep_scratch_pool();
  float* scratch = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&scratch),
                        (block_floats + stat_floats + score_floats + max_floats + size_t(rows)) * sizeof(float), stream),
        "cuda::sparse_attention");
  SplitScratch x{T, rows, scratch, nullptr, nullptr, nullptr, nullptr};
  x.stats = reinterpret_cast<float2*>(x.block + block_floats);  // block_floats is even (D is)
  x.scores = x.block + block_floats + stat_floats;
  x.tile_maxima = x.scores + score_floats;
  x.last_max = x.tile_maxima + max_floats;
  return x;
}

// Kernel 3 over the scratch, then the scratch freed on the stream.
template <int D>
void split_combine(const SplitScratch& x, int H, const float* sink, float* out, cudaStream_t stream) {
  const int64_t threads = x.rows * (D / 4);
  launch_early("cuda::sparse_attention combine", split_combine_kernel<D>,
               unsigned((threads + kCombineThreads - 1) / kCombineThreads), kCombineThreads, 0, stream, x.block, x.stats,
               x.last_max, sink, x.rows, H, x.T, out);
  check(cudaFreeAsync(x.block, stream), "cuda::sparse_attention");
}

// The split path on the CUDA cores: three launches on `stream`.
template <int D, int G>
void launch_split(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                  cudaStream_t stream) {
  const SplitScratch x = split_scratch(batch, D, stream);
  const dim3 grid(unsigned(batch.tokens), unsigned(batch.heads / G), unsigned(x.T));
  const size_t score_smem = sizeof(ScoreSmem<D, G>), pv_smem = sizeof(PvSmem<D, G>);
  check(cudaFuncSetAttribute(split_scores_kernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(score_smem)),
        "cuda::sparse_attention");
  launch_early("cuda::sparse_attention scores", split_scores_kernel<D, G>, grid, kThreads, score_smem, stream, batch, q,
               scale, x.scores, x.tile_maxima);
  check(cudaFuncSetAttribute(split_pv_kernel<D, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pv_smem)),
        "cuda::sparse_attention");
  launch_early("cuda::sparse_attention P·V", split_pv_kernel<D, G>, grid, kThreads, pv_smem, stream, batch, x.scores,
               x.tile_maxima, x.block, x.stats, x.last_max);
  split_combine<D>(x, batch.heads, sink, out, stream);
}

// The split path on the tensor cores: the same scratch and combine, 32 heads a block.
template <int D>
void launch_split_mma(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                      cudaStream_t stream) {
  const SplitScratch x = split_scratch(batch, D, stream);
  const dim3 grid(unsigned(batch.tokens), unsigned(batch.heads / kMmaHeads), unsigned(x.T));
  const size_t score_smem = sizeof(SplitMmaScoreSmem<D>), pv_smem = sizeof(SplitMmaPvSmem<D>);
  static const bool configured = [score_smem, pv_smem] {
    check(cudaFuncSetAttribute(split_mma_scores_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(score_smem)),
          "cuda::sparse_attention");
    check(cudaFuncSetAttribute(split_mma_pv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(pv_smem)),
          "cuda::sparse_attention");
    return true;
  }();
  (void)configured;
  launch_early("cuda::sparse_attention scores", split_mma_scores_kernel<D>, grid, kThreads, score_smem, stream, batch, q,
               scale, x.scores, x.tile_maxima);
  launch_early("cuda::sparse_attention P·V", split_mma_pv_kernel<D>, grid, kThreads, pv_smem, stream, batch, x.scores,
               x.tile_maxima, x.block, x.stats, x.last_max);
  split_combine<D>(x, batch.heads, sink, out, stream);
}

template <int D>
void launch_mma(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                cudaStream_t stream) {
  const size_t smem = sizeof(MmaSmem<D>);
  static const bool configured = [smem] {
    check(cudaFuncSetAttribute(mma_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "cuda::sparse_attention");
    return true;
  }();
  (void)configured;
  mma_attention_kernel<D><<<dim3(unsigned(batch.tokens), unsigned(batch.heads / kMmaHeads)), kThreads, smem, stream>>>(
      batch, q, sink, scale, out);
  check_launch("cuda::sparse_attention");
}

template <int D>
void launch_wgmma(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                  cudaStream_t stream) {
  const size_t smem = sizeof(WgSmem<D>) + 1024;  // + the alignment
  static const bool configured = [smem] {
    check(cudaFuncSetAttribute(wgmma_attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
          "cuda::sparse_attention");
    return true;
  }();
  (void)configured;
  wgmma_attention_kernel<D><<<dim3(unsigned(batch.tokens), unsigned(batch.heads / kWgHeads)), kWgThreads, smem,
                              stream>>>(batch, q, sink, scale, out);
  check_launch("cuda::sparse_attention");
}

template <int D>
void launch_dim(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                cudaStream_t stream) {
  const int H = batch.heads;
  // One block per (token, head group): as many heads per block as keep at least two blocks per
  // multiprocessor; more heads per block decode each tile fewer times.
  const int64_t blocks_wanted = 2 * int64_t(multiprocessors("cuda::sparse_attention"));
  int G = 1;
  for (int g : {8, 4, 2})
    if (H % g == 0 && batch.tokens * (H / g) >= blocks_wanted) {
      G = g;
      break;
    }
  // Split over tiles where even one head per block leaves fewer than two blocks per
  // multiprocessor (at shapes the tensor-core paths below do not take): such a block walks its
  // tiles in sequence, waiting on each tile's loads, and the GPU has too few blocks to fill the
  // wait. The split path has ⌈E/64⌉ times the blocks (80 for V4.1 at batch 1: 64·10 / 8) and
  // walks no tile sequence, at the price of a second decode of each tile and three launches.
  bool split = batch.tokens * (H / G) < blocks_wanted;
  // mma.sync from 16 blocks of 32 heads at D = 512 (BM_SparseAttention on the H200: 103 µs against
  // 179 µs split at 8 tokens, 104 against 222 at 16, 106 against 723 for the head groups at 64):
  // heads not a multiple of 64, since the warpgroup kernel below takes those from 8 tokens.
  bool mma = D == 512 && H % kMmaHeads == 0 && batch.tokens * (H / kMmaHeads) >= 16;
  // The warpgroup kernel from 8 blocks (8 tokens at 64 heads), though its blocks fill the SMs only
  // from 132: it stages each tile's entries by cp.async two tiles ahead, so its blocks' latency is
  // below the 32-head mma.sync blocks' even at a fraction of the SMs (BM_SparseAttention on an H100,
  // µs a call, mma.sync / warpgroups: 8 tokens 97.2 / 71.4, 32 98.7 / 72.1, 64 102 / 74.9, 128 130 / 81.2).
  bool wgmma = D == 512 && H % kWgHeads == 0 && batch.tokens * (H / kWgHeads) >= 8;
  // Split over the tiles on the tensor cores below the warpgroup kernel's time: while its blocks
  // (token, 32 heads, tile) fit in three waves (BM_SparseAttention on an H100 at 10 tiles, µs,
  // split tensor cores / automatic before: 1 token 30.0 / 34.1, 2 28.0 / 43.4, 4 28.4 / 63.5;
  // against the warpgroups: 8 35.8 / 72.5, 16 58.4 / 72.5, 32 96.2 / 73.1).
  const int64_t tiles = (batch.W + batch.K + kTile - 1) / kTile;
  bool split_mma = D == 512 && H % kMmaHeads == 0 &&
                   batch.tokens * (H / kMmaHeads) * tiles <= 3 * int64_t(multiprocessors("cuda::sparse_attention"));
  if (batch.path != SparseAttentionPath::automatic) {
    split = batch.path == SparseAttentionPath::split_tiles;
    split_mma = batch.path == SparseAttentionPath::split_tensor_cores;
    mma = batch.path == SparseAttentionPath::tensor_cores;
    wgmma = batch.path == SparseAttentionPath::warpgroups;
  }
  if (split_mma) {
    if constexpr (D == 512) {
      if (H % kMmaHeads == 0) return launch_split_mma<D>(batch, q, sink, scale, out, stream);
    }
    fail("cuda::sparse_attention", "D = 512 and heads a multiple of 32 for the split tensor-core path",
         "D = " + std::to_string(D) + ", " + std::to_string(H) + " heads");
  }
  if (wgmma) {
    if constexpr (D == 512) {
      if (H % kWgHeads == 0) return launch_wgmma<D>(batch, q, sink, scale, out, stream);
    }
    fail("cuda::sparse_attention", "D = 512 and heads a multiple of 64 for the warpgroup path",
         "D = " + std::to_string(D) + ", " + std::to_string(H) + " heads");
  }
  if (mma) {
    if constexpr (D == 512) {
      if (H % kMmaHeads == 0) return launch_mma<D>(batch, q, sink, scale, out, stream);
    }
    fail("cuda::sparse_attention", "D = 512 and heads a multiple of 32 for the tensor-core path",
         "D = " + std::to_string(D) + ", " + std::to_string(H) + " heads");
  }
  if (split) {
    // 8 heads per block where H allows: one warp per head in step 3, each tile decoded by H/8
    // blocks; 82 KB (kernel 1) and 66 KB (kernel 2) of shared memory at dim 512.
    if (H % 8 == 0) return launch_split<D, 8>(batch, q, sink, scale, out, stream);
    if (H % 4 == 0) return launch_split<D, 4>(batch, q, sink, scale, out, stream);
    if (H % 2 == 0) return launch_split<D, 2>(batch, q, sink, scale, out, stream);
    return launch_split<D, 1>(batch, q, sink, scale, out, stream);
  }
  switch (G) {
    case 8: return launch<D, 8>(batch, q, sink, scale, out, stream);
    case 4: return launch<D, 4>(batch, q, sink, scale, out, stream);
    case 2: return launch<D, 2>(batch, q, sink, scale, out, stream);
    default: return launch<D, 1>(batch, q, sink, scale, out, stream);
  }
}

}  // namespace

void sparse_attention(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                      cudaStream_t stream) {
  if (batch.tokens <= 0 || batch.heads <= 0) return;
  if (batch.W + batch.K <= 0) fail("cuda::sparse_attention", "at least one entry slot", "W + K = 0");
  switch (batch.dim) {
    case 64: return launch_dim<64>(batch, q, sink, scale, out, stream);
    case 512: return launch_dim<512>(batch, q, sink, scale, out, stream);
    default: fail("cuda::sparse_attention", "head dim 64 or 512", std::to_string(batch.dim));
  }
}

}  // namespace dsv41::cuda
