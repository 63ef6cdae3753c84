// MoE routing and the SwiGLU expert.
//
// Routing (route_kernel): one block of 128 threads per token. The scores of all experts
// (sqrt(softplus(logit / T)) or sigmoid) and the biased scores go to shared memory; then k rounds
// of a block arg-max (best biased score, the lower expert on ties: the CPU's partial_sort order)
// pick the experts best first, and thread 0 normalizes their unbiased scores in that order, as the
// CPU op. Traffic: the logits once (384 × 4 bytes per token for V4.1) plus the bias; the gate's
// product before it is cuda::linear_f32 (384 × 5120 bf16 = 3.9 MB per call).
//
// The expert (expert_ffn): w1 and w3 through cuda::linear (act-quantized x, fp4 weights read in
// place), one elementwise kernel for the clamped SwiGLU and the routing weight (rounded to bf16,
// the activations' dtype), then w2. Traffic per call: the three weights once (3 × 2304 × 5120 / 2
// bytes + scales ≈ 18.4 MB per V4.1 expert at fp4) and 2 × rows × 2304 × 4 for the hidden values.
//
// The sub-layer (moe()): forward.cpp's moe() with the routing kept on the device, at any row
// count. Kernels, in order (7 launches for a decode step, plus one gate pass per further 8 rows):
//   gate      cuda::linear_f32 → logits [rows, E]
//   route     route_kernel → experts, weights [rows, k] (or the forced experts, weighted)
//   bucket    bucket_kernel → each expert's entries (entry = row·k + slot) in ascending entry
//             order, cut into tiles of ≤ 8 (GEMV) or ≤ 128 (tensor cores) entries of one expert,
//             and the tile count (one unforced row: route_kernel writes its k one-entry tiles)
//   up        GEMV: grouped_kernel<up> over (tile, slice of inter): h = the SwiGLU of w1, w3 →
//             h [entry]. Tensor cores: gemm::act_quant_slots of x by entry, gemm::grouped_up →
//             g, u [slot]
//   down      GEMV: grouped_kernel<down> over (tile, slice of dim): ye [entry] = w2 h (bf16).
//             Tensor cores: gemm::act_quant_swiglu_slots (h of g, u, act-quantized in one pass),
//             gemm::grouped_down → ye [entry]
//   shared    on a side stream beside all of the above (side_stream.h), from the start: at one
//             row the GEMV kernels over the shared expert (no routing); from 2 rows expert_ffn
//             (cuda::linear's GEMMs), then to bf16
//   combine   combine_kernel: y = bf16(Σ ye over the row's experts in ascending id + shared)
// The tensor-core path computes what gemm::linear computes for each expert on its rows (the same
// kernel, its tiles gathered on the device), so a prefill's experts need no host round trip.
// The grids are sized from rows, k and E alone (the most tiles the entries can make); a block
// past the device's tile count exits at once, so a decode step reads the k chosen experts'
// weights and no other's, and each expert's weights are read once per tile of ≤ 8 of its rows.
// Measured on the H200 (ops_moe_test, E = 384 fp4 experts 2048 × 4096, fp8 shared, in a CUDA
// graph, d971ff3): 93 µs per decode call (109 MB, 1.16 TB/s), 0.98 ms at 8 rows (46 experts, 0.65
// TB/s). The grouped GEMVs take most of it; at one row they are as much issue-bound as
// latency-bound (Nsight Compute: ~4.5 instructions per fp4 weight, issue slots 29% busy at two
// blocks per SM, a third of the stalls on x in shared memory), docs/benchmarks.md.
#include "backend/cuda/moe.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "backend/cuda/gemm.cuh"
#include "backend/cuda/linear.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rows.h"
#include "backend/cuda/side_stream.h"
#include "backend/cuda/swiglu.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kRouteThreads = 128;
constexpr int kMaxExperts = 4096;
constexpr int kMaxTopk = 32;

// a beats b: higher biased score, or equal and the lower index.
__device__ __forceinline__ bool beats(float va, int a, float vb, int b) { return va > vb || (va == vb && a < b); }

// One decode row's tiles, written by route_kernel in bucket_kernel's place (null: none).
struct RowTiles {
  int32_t* list;
  int4* tiles;
  int* tile_count;
};

__global__ void __launch_bounds__(kRouteThreads) route_kernel(const float* logits, int E, const float* bias, int k,
                                                              bool sigmoid, float gate_temp, bool norm, float route_scale,
                                                              const int32_t* forced, int32_t* experts, float* weights,
                                                              const float* bias_vl, const uint8_t* image_rows,
                                                              const RowTiles one) {
  extern __shared__ float smem[];
  float* scores = smem;
  float* biased = smem + E;
  __shared__ float warp_value[kRouteThreads / 32];
  __shared__ int warp_index[kRouteThreads / 32];
  __shared__ int order[kMaxTopk];
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  const float* row_bias = image_rows && image_rows[r] ? bias_vl : bias;  // an image span's row: bias_vl
  for (int e = threadIdx.x; e < E; e += kRouteThreads) {
    const float logit = logits[r * E + e] / gate_temp;
    float s;
    if (sigmoid) s = 1.0f / (1.0f + expf(-logit));
    else s = sqrtf(logit > 20.0f ? logit : log1pf(expf(logit)));  // torch's softplus threshold
    scores[e] = s;
    biased[e] = s + row_bias[e];
  }
  __syncthreads();
  // Forced experts replace the whole choice (the CPU op copies all k over its partial sort).
  if (forced && int(threadIdx.x) < k) order[threadIdx.x] = forced[r * k + threadIdx.x];
  for (int j = 0; j < (forced ? 0 : k); ++j) {
    float best = -INFINITY;
    int index = INT_MAX;
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= order[i] == e;
      if (!taken && beats(biased[e], e, best, index)) best = biased[e], index = e;
    }
    for (int o = 16; o > 0; o /= 2) {
      const float v = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int i = __shfl_xor_sync(0xFFFFFFFFu, index, o);
      if (beats(v, i, best, index)) best = v, index = i;
    }
    if (threadIdx.x % 32 == 0) warp_value[threadIdx.x / 32] = best, warp_index[threadIdx.x / 32] = index;
    __syncthreads();
    if (threadIdx.x == 0) {
      best = warp_value[0], index = warp_index[0];
      for (int w = 1; w < kRouteThreads / 32; ++w)
        if (beats(warp_value[w], warp_index[w], best, index)) best = warp_value[w], index = warp_index[w];
      order[j] = index;
    }
    __syncthreads();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // A forced id outside [0, E) (a caller's error) weighs 0 and is skipped by moe().
    auto score = [&](int e) { return e >= 0 && e < E ? scores[e] : 0.0f; };
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += score(order[j]);
    for (int j = 0; j < k; ++j) {
      float w = score(order[j]);
      if (norm && k > 1) w /= sum + 1e-20f;  // as the CPU op (not norm_eps: as in training)
      experts[r * k + j] = order[j];
      weights[r * k + j] = w * route_scale;
    }
    // A lone unforced row's k experts are distinct: bucket_kernel would make one tile of one entry
    // per expert, in ascending expert order. Written here, that launch is saved at decode.
    if (one.tiles) {
      for (int j = 0; j < k; ++j) {
        int rank = 0;
        for (int i = 0; i < k; ++i) rank += order[i] < order[j];
        one.list[rank] = j;
        one.tiles[rank] = make_int4(order[j], rank, 1, 0);
      }
      *one.tile_count = k;
    }
  }
}


// ---- the sub-layer: bucket, grouped GEMV, combine ------------------------------------------------

using gemm::ExpertPointers;

constexpr int kTile = 8;               // entries per tile: one pass over an expert's weights
constexpr int kBucketThreads = 1024;   // bucket_kernel is one block
constexpr int kGThreads = 256;         // grouped_kernel
constexpr int kGSmemBytes = 46 * 1024;  // its slice of quantized x: with the static arrays within 48 KB (no opt-in)
constexpr int kCombineThreads = 128;  // four columns each

// Per expert, its entries (entry i = row·k + slot, for every valid id experts[i] = e) in ascending
// i, at list[offset[e] ...]; the experts' lists one after another in ascending e; and tiles[t] =
// (e, first list position, count ≤ tile) cutting each list into runs of `tile`, in list order,
// with their number in *tile_count; with `slot` (the tensor-core path, tile = gemm::kTileRows)
// also each list position's slot, t·tile + i, and -1 past the live entries. One block: counts by
// shared-memory atomics, one block-wide scan over the experts; then P warps place the entries,
// warp w those of its own chunk of n / P entries: each warp counts its chunk's entries per expert,
// a scan over the warps (in chunk order) gives each warp its first position in every expert's
// list, and the warp places its chunk 32 at a time in entry order (a lane's place among the equal
// ids of its 32 from __match_any_sync) — so every list comes out sorted, the same list whatever P
// is. Shapes: experts [n] → list [n], tiles [≤ n], smem (1 + P)·E ints (bucket_warps). Traffic:
// experts three times (n·4 bytes), list and tiles once; at decode (n = k·rows) one launch's
// latency; at an exact 4K prefill (n = 24,576) 24 steps of each warp where warp 0 alone took 768
// (an H100: 48 µs a call, against 255 with warp 0 alone).
__global__ void __launch_bounds__(kBucketThreads) bucket_kernel(const int32_t* __restrict__ experts, int n, int E,
                                                                int tile, int P, int32_t* __restrict__ list,
                                                                int4* __restrict__ tiles, int* __restrict__ tile_count,
                                                                int32_t* __restrict__ slot) {
  extern __shared__ int counts[];  // [E]: the count, then the list's first position
  int* next_at = counts + E;       // [P][E]: warp w's count of each expert, then its next position
  __shared__ int warp_entries[kBucketThreads / 32], warp_tiles[kBucketThreads / 32];
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  for (int e = int(threadIdx.x); e < E; e += kBucketThreads) counts[e] = 0;
  __syncthreads();
  for (int i = int(threadIdx.x); i < n; i += kBucketThreads) {
    const int e = experts[i];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
    if (slot) slot[i] = -1;  // a live position's is written below, by another thread: after the barriers
  }
  __syncthreads();

  // Thread t owns experts [t·per, (t+1)·per): their entry and tile totals, scanned over the block.
  const int per = (E + kBucketThreads - 1) / kBucketThreads;
  const int e0 = int(threadIdx.x) * per, e1 = min(E, e0 + per);
  int my_entries = 0, my_tiles = 0;
  for (int e = e0; e < e1; ++e) my_entries += counts[e], my_tiles += (counts[e] + tile - 1) / tile;
  int entries = my_entries, tiles_before = my_tiles;  // inclusive scans within the warp
  for (int o = 1; o < 32; o *= 2) {
    const int a = __shfl_up_sync(0xFFFFFFFFu, entries, o), b = __shfl_up_sync(0xFFFFFFFFu, tiles_before, o);
    if (lane >= o) entries += a, tiles_before += b;
  }
  if (lane == 31) warp_entries[warp] = entries, warp_tiles[warp] = tiles_before;
  __syncthreads();
  if (warp == 0) {
    int a = warp_entries[lane], b = warp_tiles[lane];
    for (int o = 1; o < 32; o *= 2) {
      const int pa = __shfl_up_sync(0xFFFFFFFFu, a, o), pb = __shfl_up_sync(0xFFFFFFFFu, b, o);
      if (lane >= o) a += pa, b += pb;
    }
    warp_entries[lane] = a, warp_tiles[lane] = b;
    if (lane == 31) *tile_count = b;
  }
  __syncthreads();
  int offset = entries - my_entries + (warp > 0 ? warp_entries[warp - 1] : 0);
  int t = tiles_before - my_tiles + (warp > 0 ? warp_tiles[warp - 1] : 0);
  for (int e = e0; e < e1; ++e) {
    const int c = counts[e];
    for (int q = 0; q * tile < c; ++q, ++t) {
      const int first = offset + q * tile, rows = min(tile, c - q * tile);
      tiles[t] = make_int4(e, first, rows, 0);
      if (slot)
        for (int i = 0; i < rows; ++i) slot[first + i] = t * tile + i;
    }
    counts[e] = offset;
    offset += c;
  }
  __syncthreads();

  // Each placing warp's chunk: whole steps of 32 entries.
  const int chunk = ((n + P - 1) / P + 31) / 32 * 32;
  const int begin = warp * chunk, end = min(n, begin + chunk);
  for (int i = int(threadIdx.x); i < P * E; i += kBucketThreads) next_at[i] = 0;
  __syncthreads();
  if (warp < P)
    for (int i = begin + lane; i < end; i += 32) {
      const int e = experts[i];
      if (e >= 0 && e < E) atomicAdd(&next_at[warp * E + e], 1);
    }
  __syncthreads();
  for (int e = int(threadIdx.x); e < E; e += kBucketThreads) {
    int at = counts[e];
    for (int w = 0; w < P; ++w) {
      const int c = next_at[w * E + e];
      next_at[w * E + e] = at;
      at += c;
    }
  }
  __syncthreads();

  if (warp < P) {
    int* mine = next_at + warp * E;
    int next = begin + lane < end ? experts[begin + lane] : -1;
    for (int base = begin; base < end; base += 32) {
      int e = next;
      next = base + 32 + lane < end ? experts[base + 32 + lane] : -1;  // the next step's load in flight
      if (e < 0 || e >= E) e = -1;
      const unsigned peers = __match_any_sync(0xFFFFFFFFu, e);
      const int leader = __ffs(peers) - 1;
      int start = 0;
      if (e >= 0 && lane == leader) {
        start = mine[e];
        mine[e] = start + __popc(peers);
      }
      start = __shfl_sync(0xFFFFFFFFu, start, leader);
      if (e >= 0) list[start + __popc(peers & ((1u << lane) - 1))] = base + lane;
      __syncwarp();
    }
  }
}

// How many warps bucket_kernel places with: as many as its shared memory holds ((1 + P)·E ints
// beside its 256 bytes of static arrays, within the 48 KB a launch has without opting in), at most
// the block's 32 (V4.1's E = 256: 32; E = 4096: 1).
int bucket_warps(int E) { return std::clamp((12 * 1024 - 64 - E) / E, 1, kBucketThreads / 32); }

// The 16-byte chunk of a weight row, decoded to floats in a fixed permutation of its K positions,
// and the matching layout of x in shared memory as float4 "parts" (part p holds the x of decoded
// slots 4p..4p+3), so each lane's x loads are 16 bytes and consecutive lanes read consecutive 16
// bytes. FP8 and FP4 are the qgemv decode (dequant.cuh's QFormat, whose comment says how the bit
// moves work); BF16 decodes in order, 8 values a chunk.
template <WeightFormat F>
struct GFormat : QFormat<F> {};
template <>
struct GFormat<WeightFormat::BF16> {
  static constexpr int kElems = 8;
  // Word j holds K offsets 2j, 2j + 1.
  __device__ static float2 word(uint32_t w) { return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xFFFF0000u)); }
  __device__ static void parts(const float* v, float4& lo, float4& hi) {
    lo = make_float4(v[0], v[1], v[2], v[3]), hi = make_float4(v[4], v[5], v[6], v[7]);
  }
};

// x[m, k0 .. k0 + kn) of the tile's rows m < M (row m at rowp[m]) into xs in the layout above (C =
// kn / kElems chunks per row): for FP8/FP4 weights act-quantized as linear.cu's qgemv (4 threads
// per 32-block, the power-of-two scale of the CPU's act_quant_fp8, the hardware e4m3 rounding),
// for BF16 as they are.
template <WeightFormat F>
__device__ void load_slice(const float* const* rowp, int64_t k0, int M, int kn, float4* xs) {
  using Fmt = GFormat<F>;
  constexpr int P = Fmt::kElems / 4;
  const int per_row = kn / 8, C = kn / Fmt::kElems, items = M * per_row;  // quantized: items a multiple of 4
  for (int base = 0; base < items; base += kGThreads) {  // the same trip count in every thread: shuffles stay whole
    const int i = base + int(threadIdx.x);
    const bool on = i < items;
    const int m = on ? i / per_row : 0, q = on ? i % per_row : 0;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (on) {
      const float4 a = *reinterpret_cast<const float4*>(rowp[m] + k0 + 8 * q);
      const float4 b = *reinterpret_cast<const float4*>(rowp[m] + k0 + 8 * q + 4);
      v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    if constexpr (F != WeightFormat::BF16) {
      float amax = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[e]));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, 2));
      const float scale = swa_fp8::block_scale(amax), inv = 1.0f / scale;  // a power of two: inv is exact
#pragma unroll
      for (int e = 0; e < 8; e += 2) {
        const float2 r = e4m3_round2(v[e] * inv, v[e + 1] * inv);
        v[e] = r.x * scale, v[e + 1] = r.y * scale;
      }
    }
    if (!on) continue;
    float4 lo, hi;
    Fmt::parts(v, lo, hi);
    const int c = 8 * q / Fmt::kElems, p = 8 * q % Fmt::kElems / 4;
    xs[(m * P + p) * C + c] = lo;
    xs[(m * P + p + 1) * C + c] = hi;
  }
}

// One chunk c (of C in the slice) of the group's two weight rows against the tile's M ≤ MT x rows:
// the block partials (exact products summed in fp32), times the weight block scale (weight_scale of
// its code ws; 1 for BF16) into acc. p·s is exact (s a power of two), so the fused add rounds once,
// as the CPU's acc += dot·s. Rows m ≥ M are skipped (M is the same in the whole block).
template <WeightFormat F, int MT>
__device__ __forceinline__ void chunk_fma(const uint4 (&wv)[2], const uint8_t (&ws)[2], const float4* xs, int C, int c,
                                          int M, float (&acc)[2][MT]) {
  using Fmt = GFormat<F>;
  constexpr int P = Fmt::kElems / 4;
  float p[2][MT];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) p[r][m] = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // the chunk's four 32-bit words, decoded once for all rows m
    uint32_t w[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) w[r] = j == 0 ? wv[r].x : j == 1 ? wv[r].y : j == 2 ? wv[r].z : wv[r].w;
    if constexpr (F == WeightFormat::FP8) {
      float2 a[2], b[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) Fmt::word(w[r], a[r], b[r]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= M) continue;
        const float4 xv = xs[(m * P + j) * C + c];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          p[r][m] = fmaf(a[r].x, xv.x, p[r][m]), p[r][m] = fmaf(a[r].y, xv.y, p[r][m]);
          p[r][m] = fmaf(b[r].x, xv.z, p[r][m]), p[r][m] = fmaf(b[r].y, xv.w, p[r][m]);
        }
      }
    } else if constexpr (F == WeightFormat::FP4) {
      float2 a[2], b[2], cc[2], d[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) Fmt::word(w[r], a[r], b[r], cc[r], d[r]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= M) continue;
        const float4 xa = xs[(m * P + 2 * j) * C + c], xb = xs[(m * P + 2 * j + 1) * C + c];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          p[r][m] = fmaf(a[r].x, xa.x, p[r][m]), p[r][m] = fmaf(a[r].y, xa.y, p[r][m]);
          p[r][m] = fmaf(b[r].x, xa.z, p[r][m]), p[r][m] = fmaf(b[r].y, xa.w, p[r][m]);
          p[r][m] = fmaf(cc[r].x, xb.x, p[r][m]), p[r][m] = fmaf(cc[r].y, xb.y, p[r][m]);
          p[r][m] = fmaf(d[r].x, xb.z, p[r][m]), p[r][m] = fmaf(d[r].y, xb.w, p[r][m]);
        }
      }
    } else {
      float2 a[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) a[r] = Fmt::word(w[r]);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        if (m >= M) continue;
        const float4 xv = xs[(m * P + j / 2) * C + c];
        const float x0 = j % 2 == 0 ? xv.x : xv.z, x1 = j % 2 == 0 ? xv.y : xv.w;
#pragma unroll
        for (int r = 0; r < 2; ++r) p[r][m] = fmaf(a[r].x, x0, p[r][m]), p[r][m] = fmaf(a[r].y, x1, p[r][m]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float s = 1.0f;
    if constexpr (F != WeightFormat::BF16) s = weight_scale<F>(ws[r]);
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (m < M) acc[r][m] = fmaf(p[r][m], s, acc[r][m]);
  }
}

// What one grouped_kernel launch works on. Routed: tile t of bucket_kernel's (exit when t ≥
// *tile_count), its entries at list[first ...], weights table[expert]. Dense (tiles == nullptr,
// the shared expert): tile t = rows t·MT .. of dense_rows, entry = row, weights `fixed`.
struct GroupedArgs {
  const int4* tiles;
  const int* tile_count;
  const int32_t* list;
  int64_t dense_rows;
  int k;            // up: the x row of entry i is i / k (1 when dense)
  const float* x;   // up: the layer's input [rows, K]; down: h [entries in list order, K]
  int64_t K, N;     // the weights' input and output features
  const ExpertPointers* table;
  ExpertPointers fixed;
  const float* weights;  // up: the routing weight of entry i, or nullptr (dense: none)
  float limit;
  float* h;        // up's output [entries in list order, N]
  uint16_t* ye;    // down's output [entry, N], bf16
};

// The grouped GEMV: for one tile of ≤ MT entries of one expert, a slice of the output features.
// up (kUp): h[pos, n] = swiglu(bf16(w1[n]·xq), bf16(w3[n]·xq)) with the entry's routing weight,
// each group of L lanes owning output n of both w1 and w3 (two weight rows sharing each x load);
// down: ye[entry, n .. n + 1] = bf16(w2[n .. n + 1]·hq). Otherwise linear.cu's qgemv: x gathered
// by entry and act-quantized per slice into shared memory (K in slices of ≤ 46 KB of fp32 for the
// tile's M rows), the weight streamed in 16-byte loads, U·2 in flight per lane, decoded in
// registers, never through shared memory (the next step's loads issued before this step's math);
// the group's partials summed by shuffles.
// Grid: (the most tiles the entries can make, row groups of 256 / L · (kUp ? 1 : 2) outputs, or
// fewer when one slice holds x: then a block loops over row groups, as qgemv). Traffic per tile:
// its expert's weight rows once (the whole expert over the grid's y: 2 × inter × dim for up, dim ×
// inter for down, at fp4 half a byte each plus a scale per 32), M rows of x from L2 per block, and
// M·N outputs (up: fp32 h, down: bf16 ye). Blocks past the tile count read nothing.
// At MT = 1 (decode) the kernel waits on memory, not on its arithmetic: three blocks per SM (≤ 85
// registers, no spills; ptxas chose ~117 and two blocks) keep more loads in flight. At MT = 8 two
// blocks (≤ 128 registers): asked for one, ptxas takes 138 and batch-8 MoE ran 1.7× slower.
template <WeightFormat F, int MT, int L, bool kUp, bool kTiled>
__global__ void __launch_bounds__(kGThreads, MT == 1 ? 3 : 2) grouped_kernel(const GroupedArgs a) {
  using Fmt = GFormat<F>;
  constexpr int E = Fmt::kElems;
  constexpr int U = MT == 1 ? 2 : 1;  // chunks per row and step: U·2 loads in flight, twice over
  constexpr int kGroups = kGThreads / L;
  extern __shared__ float4 xs[];
  __shared__ const float* rowp[MT];
  __shared__ int64_t outrow[MT];
  __shared__ float roww[MT];

  int expert = 0, first, M;
  wait_for_inputs();
  if (a.tiles) {
    if (int(blockIdx.x) >= *a.tile_count) return;
    const int4 t = a.tiles[blockIdx.x];
    expert = t.x, first = t.y, M = t.z;
  } else {
    first = int(blockIdx.x) * MT;
    M = int(a.dense_rows - first < MT ? a.dense_rows - first : MT);
  }
  const ExpertPointers ep = a.table ? a.table[expert] : a.fixed;
  const int lane = int(threadIdx.x) % L, group = int(threadIdx.x) / L;
  const int64_t row_chunks = a.K / E, blocks = a.K / 32;
  constexpr int kPerBlock = kGroups * (kUp ? 1 : 2);  // output features per block and row group
  const int64_t row_groups = (a.N + kPerBlock - 1) / kPerBlock;
  int64_t n[2];
  const uint8_t* base[2];
  const uint8_t* scale[2];
  if constexpr (kUp) {
    base[0] = ep.data[0], base[1] = ep.data[2], scale[0] = ep.scale[0], scale[1] = ep.scale[2];
  } else {
    base[0] = base[1] = ep.data[1], scale[0] = scale[1] = ep.scale[1];
  }
  bool live[2];
  const uint4* wrow[2];
  const uint8_t* srow[2];
  // Where chunk c of a row lies: the c / kSeg-th segment of kSeg chunks (one k-tile) at `stride`
  // chunks from the last, scale block c·E/32 in the (c·E/32 / 4)-th group of 4 at `sstride` bytes.
  // kTiled (the table's quantized experts): gemm.cuh's tile layout, segments 128 rows apart and
  // scales a tile's run apart; else (the shared expert, bf16 experts) row-major, both adjacent.
  constexpr int kSeg = gemm::kTileK / E;
  const gemm::TileLayout layout{F == WeightFormat::FP4, a.N, a.K};
  constexpr int stride = kTiled ? int(gemm::kTileRows) * kSeg : kSeg;
  constexpr int sstride = kTiled ? (F == WeightFormat::FP4 ? int(gemm::kTileRows) * 4 : 16) : 4;
  // The group's weight rows in row group g: up, output g·kGroups + group of both w1 and w3;
  // down, outputs 2(g·kGroups + group) and the next of w2.
  auto select = [&](int64_t g) {
    if constexpr (kUp) n[0] = n[1] = g * kGroups + group;
    else n[0] = (g * kGroups + group) * 2, n[1] = n[0] + 1;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      live[r] = n[r] < a.N;
      const int64_t nr = live[r] ? n[r] : 0;
      wrow[r] = reinterpret_cast<const uint4*>(base[r] + (kTiled ? layout.code(nr, 0) : nr * row_chunks * 16));
      srow[r] = scale[r] + (kTiled                        ? layout.scale(nr, 0)
                            : F == WeightFormat::FP8 ? (nr / 32) * blocks
                                                     : nr * blocks);
    }
  };

  // The slice: as much of K as M rows of fp32 fit in the shared memory, whole group steps.
  const int64_t step = int64_t(L) * E, fit = int64_t(kGSmemBytes / 4 / M) / step * step;
  const int64_t slice = a.K < fit ? a.K : fit;
  uint4 wv[U][2], nv[U][2];  // this step's chunks, the next step's (in flight during this one's math)
  uint8_t ws[U][2], ns[U][2];  // their blocks' scale codes (none for BF16)
  float acc[2][MT];
  // The U·2 chunks of one step of the lane, from global chunk c0 + c on (zeros past C or N).
  auto fetch = [&](int64_t c0, int c, int C, uint4 (&wv)[U][2], uint8_t (&ws)[U][2]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int cu = c + u * L;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const bool ok = cu < C && live[r];
        const int64_t c = c0 + cu;
        wv[u][r] = ok ? load_stream(wrow[r] + c / kSeg * stride + c % kSeg) : make_uint4(0, 0, 0, 0);
        if constexpr (F == WeightFormat::BF16) {
          ws[u][r] = 0;
        } else {
          // fp8: one scale per 32 rows × 32 columns; fp4: one per row × 32 columns (= a chunk).
          const int64_t b = c * E / 32;
          ws[u][r] = ok ? srow[r][b / 4 * sstride + b % 4] : uint8_t(0);
        }
      }
    }
  };
  // The first step's weight loads go out before anything else the block waits for (its rows'
  // entries, x, the quantization): at decode they are all of the lane's loads.
  const int first_C = int((a.K < slice ? a.K : slice) / E);
  select(blockIdx.y);
  fetch(0, lane, first_C, wv, ws);
  if (int(threadIdx.x) < M) {
    const int m = int(threadIdx.x);
    const int64_t pos = first + m, entry = a.tiles ? a.list[pos] : pos;
    if constexpr (kUp) {
      rowp[m] = a.x + entry / a.k * a.K;
      roww[m] = a.weights ? a.weights[entry] : 1.0f;
      outrow[m] = pos;
    } else {
      rowp[m] = a.x + pos * a.K;
      outrow[m] = entry;
    }
  }
  __syncthreads();
  // Row groups blockIdx.y, + gridDim.y, ...: with one slice x is quantized once for all of them
  // and the warps stream on without a barrier; with several slices the grid gives each block one.
  for (int64_t g = blockIdx.y; g < row_groups; g += gridDim.y) {
    const bool first_group = g == int64_t(blockIdx.y);
    if (!first_group) select(g), fetch(0, lane, first_C, wv, ws);
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m) acc[r][m] = 0;
    for (int64_t k0 = 0; k0 < a.K; k0 += slice) {
      const int kn = int(a.K - k0 < slice ? a.K - k0 : slice), C = kn / E;
      const int64_t c0 = k0 / E;
      if (first_group || slice < a.K) {  // block-uniform: the barriers below are whole
        if (k0 > 0) fetch(c0, lane, C, wv, ws);  // the slice's first step in flight while its x is quantized
        if (k0 > 0 || !first_group) __syncthreads();  // every lane is done with the previous slice's x
        load_slice<F>(rowp, k0, M, kn, xs);
        __syncthreads();
      }
      for (int c = lane; c < C; c += L * U) {
        fetch(c0, c + L * U, C, nv, ns);
#pragma unroll
        for (int u = 0; u < U; ++u)
          if (c + u * L < C) chunk_fma<F, MT>(wv[u], ws[u], xs, C, c + u * L, M, acc);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int r = 0; r < 2; ++r) wv[u][r] = nv[u][r], ws[u][r] = ns[u][r];
      }
    }

    // Sum over the group's L lanes (every lane ends with the sums), then one lane per output writes.
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int m = 0; m < MT; ++m)
        if (m < M)
#pragma unroll
          for (int o = L / 2; o > 0; o /= 2) acc[r][m] += __shfl_xor_sync(0xFFFFFFFFu, acc[r][m], o);
    if constexpr (kUp) {
#pragma unroll
      for (int m = 0; m < MT; ++m)
        if (m < M && lane == m % L && live[0])
          a.h[outrow[m] * a.N + n[0]] =
              swiglu(round_bf16(acc[0][m]), round_bf16(acc[1][m]), a.limit, a.weights ? &roww[m] : nullptr);
    } else {
#pragma unroll
      for (int e = 0; e < 2 * MT; ++e) {
        const int r = e / MT, m = e % MT;
        if (m < M && lane == e % L && live[r]) a.ye[outrow[m] * a.N + n[r]] = bf16_from_float(acc[r][m]);
      }
    }
  }
}

// y[r] = bf16(Σ ye[r·k + j] over the row's slots in ascending (expert, slot) + ys[r]): the CPU's
// y += ye in expert order from 0.0f (a row routed twice to one expert adds it twice, slot order),
// then + the shared expert. Grid (rows, dim / 512): a block's first k threads rank the row's
// slots, then each thread owns four columns and loads all k + 1 of their 8-byte bf16 quads before
// the ordered sum, and stores its four sums at once (with two columns a thread, 28 bytes a thread
// in flight: 274 µs a call at 4K rows on an H100, ~half the copy bandwidth). dim is a multiple of
// 8 (the experts' K), so every access is aligned. Traffic per row: (k + 1)·dim bf16 read, dim fp32
// written.
__global__ void __launch_bounds__(kCombineThreads) combine_kernel(const int32_t* __restrict__ experts, int k, int E,
                                                                  const uint16_t* __restrict__ ye,
                                                                  const uint16_t* __restrict__ ys, int64_t dim,
                                                                  float* __restrict__ y) {
  __shared__ int order[kMaxTopk];
  __shared__ int valid;
  wait_for_inputs();
  const int64_t r = blockIdx.x;
  if (int(threadIdx.x) < k) {
    const int j = int(threadIdx.x), e = experts[r * k + j];
    int rank = 0, count = 0;
    for (int i = 0; i < k; ++i) {
      const int f = experts[r * k + i];
      if (f < 0 || f >= E) continue;
      ++count;
      rank += f < e || (f == e && i < j);
    }
    if (e >= 0 && e < E) order[rank] = j;
    if (j == 0) valid = count;
  }
  __syncthreads();
  const int64_t d = (int64_t(blockIdx.y) * kCombineThreads + threadIdx.x) * 4;
  if (d >= dim) return;
  const int n = valid;
  uint2 v[kMaxTopk];
#pragma unroll
  for (int q = 0; q < kMaxTopk; ++q)
    if (q < n) v[q] = *reinterpret_cast<const uint2*>(ye + (r * k + order[q]) * dim + d);
  const uint2 vs = *reinterpret_cast<const uint2*>(ys + r * dim + d);
  const auto unpack = [](uint2 quad, float (&f)[4]) {  // four bf16, in column order
    f[0] = __uint_as_float(quad.x << 16), f[1] = __uint_as_float(quad.x & 0xFFFF0000u);
    f[2] = __uint_as_float(quad.y << 16), f[3] = __uint_as_float(quad.y & 0xFFFF0000u);
  };
  float s[4] = {0.0f, 0.0f, 0.0f, 0.0f}, t[4];
#pragma unroll
  for (int q = 0; q < kMaxTopk; ++q)
    if (q < n) {
      unpack(v[q], t);
#pragma unroll
      for (int c = 0; c < 4; ++c) s[c] += t[c];
    }
  unpack(vs, t);
  *reinterpret_cast<float4*>(y + r * dim + d) =
      make_float4(round_bf16(s[0] + t[0]), round_bf16(s[1] + t[1]), round_bf16(s[2] + t[2]), round_bf16(s[3] + t[3]));
}

template <WeightFormat F, int MT, int L, bool kUp, bool kTiled>
void launch_grouped_l(const GroupedArgs& a, int64_t tiles, cudaStream_t stream) {
  const int64_t per_block = int64_t(kGThreads / L) * (kUp ? 1 : 2);
  const int64_t row_groups = (a.N + per_block - 1) / per_block;
  if (tiles > INT_MAX) fail("cuda::moe", "a grid within CUDA's limits", std::to_string(tiles) + " tiles");
  // Each tile's blocks loop over its row groups when one slice of x serves them all (MT·K·4 bytes
  // fit): together the grid's blocks are what the GPU holds at once. Else one block per row group.
  static const int resident = resident_blocks(grouped_kernel<F, MT, L, kUp, kTiled>, kGThreads, kGSmemBytes, "cuda::moe");
  const bool one_slice = int64_t(MT) * a.K * 4 <= kGSmemBytes;
  const int64_t per_tile = one_slice ? std::min(row_groups, std::max<int64_t>(1, resident / tiles)) : row_groups;
  if (per_tile > 65535) fail("cuda::moe", "a grid within CUDA's limits", std::to_string(a.N) + " outputs");
  const dim3 grid{unsigned(tiles), unsigned(per_tile)};
  const size_t smem = size_t(MT * a.K * 4 < kGSmemBytes ? MT * a.K * 4 : kGSmemBytes);
  launch_early("cuda::moe grouped", grouped_kernel<F, MT, L, kUp, kTiled>, grid, kGThreads, smem, stream, a);
}

template <WeightFormat F, int MT, bool kUp>
void launch_grouped(const GroupedArgs& a, int64_t tiles, cudaStream_t stream) {
  // L: 32 lanes per group unless that wastes more than 1/8 of their steps on K (inter 2304 at fp4:
  // 72 chunks, L = 16), as linear.cu.
  // The table's quantized experts are tiled (gemm.cuh), the shared expert's weights row-major.
  const int64_t chunks = a.K / GFormat<F>::kElems;
  const bool wide = (chunks + 31) / 32 * 32 * 8 <= chunks * 9;
  const auto launch = [&](auto tiled) {
    constexpr bool kTiled = decltype(tiled)::value;
    if (wide) launch_grouped_l<F, MT, 32, kUp, kTiled>(a, tiles, stream);
    else launch_grouped_l<F, MT, 16, kUp, kTiled>(a, tiles, stream);
  };
  if (a.table) launch(std::bool_constant<F != WeightFormat::BF16>{});
  else launch(std::false_type{});
}

template <bool kUp>
void grouped(WeightFormat f, int tile, const GroupedArgs& a, int64_t tiles, cudaStream_t stream) {
  const bool one = tile == 1;
  switch (f) {
    case WeightFormat::FP4:
      return one ? launch_grouped<WeightFormat::FP4, 1, kUp>(a, tiles, stream)
                 : launch_grouped<WeightFormat::FP4, kTile, kUp>(a, tiles, stream);
    case WeightFormat::FP8:
      return one ? launch_grouped<WeightFormat::FP8, 1, kUp>(a, tiles, stream)
                 : launch_grouped<WeightFormat::FP8, kTile, kUp>(a, tiles, stream);
    case WeightFormat::BF16:
      return one ? launch_grouped<WeightFormat::BF16, 1, kUp>(a, tiles, stream)
                 : launch_grouped<WeightFormat::BF16, kTile, kUp>(a, tiles, stream);
    default: fail("cuda::moe", "expert weights in FP4, FP8 or BF16", "F32");
  }
}

// An expert weight the grouped kernels read: FP4/FP8 with K a multiple of 32, BF16 with K a
// multiple of 8 (whole 16-byte chunks per row).
void check_expert_weight(const Weight& w, int64_t rows, int64_t cols, const char* what) {
  const std::string name = std::string("cuda::moe ") + what;
  if (w.format == WeightFormat::F32) fail(name, "FP4, FP8 or BF16", "F32");
  if (w.rows != rows || w.cols != cols)
    fail(name, std::to_string(rows) + " x " + std::to_string(cols),
         std::to_string(w.rows) + " x " + std::to_string(w.cols));
  if (cols % (w.quantized() ? 32 : 8) != 0) fail(name, "input features a multiple of 32 (8 for BF16)", std::to_string(cols));
  if (!w.data || (w.quantized() && !w.scale)) fail(name, "device data (and scales)", "a null pointer");

}

// h = bf16(weight · silu(min(g, L)) · clamp(u, -L, L)) in place of g, the CPU op's expressions.
__global__ void swiglu_kernel(float* g, const float* u, int64_t rows, int64_t inter, float limit,
                              const float* row_weights) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  g[i] = swiglu(g[i], u[i], limit, row_weights ? row_weights + i / inter : nullptr);
}

// bias_vl's values for rows of image spans (null when there are none), checked as the bias is.
const float* vision_bias(const Weight* bias_vl, const uint8_t* image_rows, int64_t experts, const char* where) {
  if (!image_rows) return nullptr;
  if (!bias_vl || !bias_vl->data) fail(where, "a gate.bias_vl for rows of an image span", "none (a checkpoint without vision)");
  if (bias_vl->format != WeightFormat::F32 || bias_vl->rows * bias_vl->cols != experts)
    fail(where, "an F32 bias_vl of one value per expert", "another bias_vl");
  return reinterpret_cast<const float*>(bias_vl->data);
}

void launch_route(const float* logits, int64_t rows, int n_experts, const float* bias, const GateOptions& opt,
                  int32_t* experts, float* weights, cudaStream_t stream, const int32_t* forced, const float* bias_vl,
                  const uint8_t* image_rows, const RowTiles& one) {
  if (!bias_vl != !image_rows) fail("cuda::route", "bias_vl and image rows together", bias_vl ? "bias_vl alone" : "image rows alone");
  if (opt.score_func != "sqrtsoftplus" && opt.score_func != "sigmoid")
    fail("cuda::route", "score_func sqrtsoftplus or sigmoid", opt.score_func);
  if (n_experts <= 0 || n_experts > kMaxExperts)
    fail("cuda::route", "1 to 4096 experts", std::to_string(n_experts));
  if (opt.topk <= 0 || opt.topk > kMaxTopk || opt.topk > n_experts)
    fail("cuda::route", "top-k in [1, min(32, experts)]", std::to_string(opt.topk));
  launch_early("cuda::route", route_kernel, unsigned(rows), kRouteThreads, size_t(2 * n_experts) * sizeof(float), stream,
               logits, n_experts, bias, opt.topk, opt.score_func == "sigmoid", opt.gate_temp, opt.norm_topk_prob,
               opt.route_scale, forced, experts, weights, bias_vl, image_rows, one);
}

// Byte i of a matrix's tile layout (gemm.cuh TileLayout) from its row-major codes, or with `scales`
// from its row-major scales (fp4 [N][K/32], fp8 [⌈N/32⌉][⌈K/32⌉]); zero where the tiles pad N or K.
// A load-time copy, one thread a byte: the source need not be aligned.
__global__ void tile_kernel(const uint8_t* __restrict__ src, gemm::TileLayout l, bool scales, int64_t bytes,
                            uint8_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= bytes) return;
  const int64_t per = scales ? l.tile_scales() : gemm::kTileRows * l.row_bytes(), tile = i / per, within = i % per;
  const int64_t nt = tile / l.k_tiles(), kt = tile % l.k_tiles();
  int64_t row, col, rows, cols;  // the source's [rows][cols] bytes and this byte's place there
  if (!scales) {
    row = nt * gemm::kTileRows + within / l.row_bytes(), col = kt * l.row_bytes() + within % l.row_bytes();
    rows = l.N, cols = l.fp4 ? l.K / 2 : l.K;
  } else if (l.fp4) {
    row = nt * gemm::kTileRows + within / 4, col = kt * 4 + within % 4;
    rows = l.N, cols = l.K / 32;
  } else {
    row = nt * (gemm::kTileRows / 32) + within / 4, col = kt * 4 + within % 4;
    rows = (l.N + 31) / 32, cols = (l.K + 31) / 32;
  }
  out[i] = row < rows && col < cols ? src[row * cols + col] : uint8_t(0);
}

}  // namespace

void route_from_logits(const float* logits, int64_t rows, int n_experts, const float* bias, const GateOptions& opt,
                       int32_t* experts, float* weights, cudaStream_t stream, const int32_t* forced, const float* bias_vl,
                       const uint8_t* image_rows) {
  if (rows <= 0) return;
  launch_route(logits, rows, n_experts, bias, opt, experts, weights, stream, forced, bias_vl, image_rows, {});
}

void route(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
           int32_t* experts, float* weights, cudaStream_t stream, const int32_t* forced, const Weight* bias_vl,
           const uint8_t* image_rows) {
  if (rows <= 0) return;
  if (bias.format != WeightFormat::F32 || bias.rows * bias.cols != gate.rows)
    fail("cuda::route", "an F32 bias of one value per expert", "another bias");
  const float* vl = vision_bias(bias_vl, image_rows, gate.rows, "cuda::route");
  keep_scratch_pool();
  float* logits = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&logits), size_t(rows * gate.rows) * sizeof(float), stream),
        "cuda::route");
  linear_f32(x, rows, gate, logits, stream);
  route_from_logits(logits, rows, int(gate.rows), reinterpret_cast<const float*>(bias.data), opt, experts, weights,
                    stream, forced, vl, image_rows);
  check(cudaFreeAsync(logits, stream), "cuda::route");
}

void expert_ffn(const float* x, int64_t rows, const Weight& w1, const Weight& w2, const Weight& w3, float limit,
                const float* row_weights, float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t inter = w1.rows, n = rows * inter;
  keep_scratch_pool();
  float *g = nullptr, *u = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&g), size_t(n) * sizeof(float), stream), "cuda::expert_ffn");
  check(cudaMallocAsync(reinterpret_cast<void**>(&u), size_t(n) * sizeof(float), stream), "cuda::expert_ffn");
  linear(x, rows, w1, g, stream);
  linear(x, rows, w3, u, stream);
  swiglu_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(g, u, rows, inter, limit, row_weights);
  check_launch("cuda::expert_ffn swiglu");
  linear(g, rows, w2, y, stream);
  check(cudaFreeAsync(g, stream), "cuda::expert_ffn");
  check(cudaFreeAsync(u, stream), "cuda::expert_ffn");
}

ExpertTable::ExpertTable(const std::vector<Weight>& w1, const std::vector<Weight>& w2, const std::vector<Weight>& w3) {
  const size_t n = w1.size();
  if (n == 0 || n > size_t(kMaxExperts) || w2.size() != n || w3.size() != n)
    fail("cuda::ExpertTable", "1 to 4096 experts, as many w1, w2 and w3",
         std::to_string(w1.size()) + ", " + std::to_string(w2.size()) + ", " + std::to_string(w3.size()));
  w1_ = w1[0], w2_ = w2[0], w3_ = w3[0];
  const int64_t inter = w1_.rows, dim = w1_.cols;
  std::vector<ExpertPointers> host(n);
  for (size_t e = 0; e < n; ++e) {
    check_expert_weight(w1[e], inter, dim, "w1");
    check_expert_weight(w3[e], inter, dim, "w3");
    check_expert_weight(w2[e], dim, inter, "w2");
    if (w1[e].format != w1_.format || w3[e].format != w1_.format || w2[e].format != w2_.format)
      fail("cuda::ExpertTable", "one format for every expert's w1 and w3, one for every w2", "mixed formats");
    host[e] = ExpertPointers{{w1[e].data, w2[e].data, w3[e].data}, {w1[e].scale, w2[e].scale, w3[e].scale}};
  }
  // The quantized matrices' tile-layout copies, each part 256-byte aligned, in one allocation.
  const Weight* first[3] = {&w1_, &w2_, &w3_};
  auto layout = [&](int m) { return gemm::TileLayout{first[m]->format == WeightFormat::FP4, first[m]->rows, first[m]->cols}; };
  auto round = [](int64_t b) { return (b + 255) / 256 * 256; };
  int64_t per_expert = 0;
  for (int m = 0; m < 3; ++m)
    if (first[m]->quantized()) per_expert += round(layout(m).code_bytes()) + round(layout(m).scale_bytes());
  bytes_ = per_expert * int64_t(n);
  if (bytes_ > 0) check(cudaMalloc(&tiles_, size_t(bytes_)), "cuda::ExpertTable");
  const std::vector<Weight>* from[3] = {&w1, &w2, &w3};
  constexpr int kThreads = 256;
  auto copy = [&](const uint8_t* src, const gemm::TileLayout& l, bool scales, int64_t bytes, uint8_t* out) {
    tile_kernel<<<unsigned((bytes + kThreads - 1) / kThreads), kThreads>>>(src, l, scales, bytes, out);
    check_launch("cuda::ExpertTable tiles");
  };
  uint8_t* at = tiles_;
  for (size_t e = 0; e < n; ++e)
    for (int m = 0; m < 3; ++m) {
      if (!first[m]->quantized()) continue;
      const gemm::TileLayout l = layout(m);
      const Weight& w = (*from[m])[e];
      copy(w.data, l, false, l.code_bytes(), at);
      host[e].data[m] = at;
      at += round(l.code_bytes());
      copy(w.scale, l, true, l.scale_bytes(), at);
      host[e].scale[m] = at;
      at += round(l.scale_bytes());
    }
  for (size_t e = 0; e < n; ++e)
    for (int m = 0; m < 3; ++m) aligned_ = aligned_ && gemm::aligned(host[e].data[m], host[e].scale[m]);
  check(cudaMalloc(&table_, n * sizeof(ExpertPointers)), "cuda::ExpertTable");
  check(cudaMemcpy(table_, host.data(), n * sizeof(ExpertPointers), cudaMemcpyHostToDevice), "cuda::ExpertTable");
  check(cudaDeviceSynchronize(), "cuda::ExpertTable");  // the copies done: the caller may free the sources
  experts_ = int(n);
}

ExpertTable::~ExpertTable() {
  cudaFree(table_);
  cudaFree(tiles_);
}

void moe(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
         const ExpertTable& routed, const Weight& s1, const Weight& s2, const Weight& s3, float limit,
         const int32_t* forced, int32_t* experts, float* weights, float* y, cudaStream_t stream, MoePath path,
         const Weight* bias_vl, const uint8_t* image_rows) {
  if (rows <= 0) return;
  const int E = routed.experts(), k = opt.topk;
  const int64_t dim = routed.dim(), inter = routed.inter(), inter_s = s1.rows;
  if (gate.rows != E || gate.cols != dim)
    fail("cuda::moe", "a gate of " + std::to_string(E) + " x " + std::to_string(dim),
         std::to_string(gate.rows) + " x " + std::to_string(gate.cols));
  if (bias.format != WeightFormat::F32 || bias.rows * bias.cols != E)
    fail("cuda::moe", "an F32 bias of one value per expert", "another bias");
  const float* vl = vision_bias(bias_vl, image_rows, E, "cuda::moe");
  check_expert_weight(s1, inter_s, dim, "shared w1");
  check_expert_weight(s3, inter_s, dim, "shared w3");
  check_expert_weight(s2, dim, inter_s, "shared w2");
  if (s3.format != s1.format) fail("cuda::moe", "the shared w1 and w3 in one format", "two formats");
  if (k <= 0 || k > kMaxTopk || k > E) fail("cuda::moe", "top-k in [1, min(32, experts)]", std::to_string(k));
  if (opt.score_func != "sqrtsoftplus" && opt.score_func != "sigmoid")
    fail("cuda::moe", "score_func sqrtsoftplus or sigmoid", opt.score_func);
  const int64_t n = rows * k;
  if (n > INT_MAX / 2) fail("cuda::moe", "rows · k < 2^30", std::to_string(n));

  // The path, and the tiles of the routed entries: for the GEMV one entry each when no expert can
  // have two (one row, no forcing), else up to kTile; for the tensor cores up to 128. The most tiles
  // n entries make over ≤ min(E, n) experts: Σ ceil(c_e / tile) ≤ (n + (tile − 1)·min(E, n)) / tile,
  // and never more than n.
  const int64_t nonzero = n < E ? n : E;
  auto tiles_of = [&](int64_t tile) { return std::min<int64_t>(n, (n + (tile - 1) * nonzero) / tile); };
  const bool tensor_ok = routed.aligned() &&
                         gemm::grouped_usable(routed.w1().format, routed.w2().format, dim, inter, tiles_of(gemm::kTileRows));
  if (path == MoePath::tensor_cores && !tensor_ok)
    fail("cuda::moe", "aligned fp8/fp4 routed experts with dim and inter multiples of 128 for the tensor-core path",
         std::string(routed.w1().quantized() && routed.w2().quantized() ? "quantized" : "unquantized") + " experts of " +
             std::to_string(inter) + " x " + std::to_string(dim));
  const bool tensor = path == MoePath::tensor_cores || (path == MoePath::automatic && tensor_ok && (rows > 1 || forced));
  const int tile = tensor ? int(gemm::kTileRows) : rows == 1 && !forced ? 1 : kTile;
  const int64_t max_tiles = tiles_of(tile), slots = max_tiles * gemm::kTileRows;
  const int dense_tile = rows == 1 ? 1 : kTile;
  const int64_t dense_tiles = (rows + dense_tile - 1) / dense_tile;
  const bool shared_gemm = rows >= gemm::kMinRows;  // cuda::linear's GEMMs: one pass over the weights per 128 rows

  // One scratch allocation, each part 256-byte aligned (the paths' parts, the rest 0 bytes).
  size_t bytes = 0;
  auto part = [&](size_t size) {
    const size_t at = bytes;
    bytes += (size + 255) / 256 * 256;
    return at;
  };
  const int64_t wide = std::max(dim, inter);
  const size_t at_logits = part(size_t(rows) * E * 4), at_list = part(size_t(n) * 4),
               at_tiles = part(size_t(max_tiles) * sizeof(int4)), at_count = part(4), at_slot = part(tensor ? size_t(n) * 4 : 0),
               at_h = part(size_t(tensor ? slots : n) * inter * 4), at_u = part(tensor ? size_t(slots) * inter * 4 : 0),
               at_xq = part(tensor ? size_t(slots * wide) * 2 : 0), at_ye = part(size_t(n) * dim * 2),
               at_hs = part(shared_gemm ? 0 : size_t(rows) * inter_s * 4), at_ys32 = part(shared_gemm ? size_t(rows) * dim * 4 : 0),
               at_ys = part(size_t(rows) * dim * 2);
  keep_scratch_pool();
  uint8_t* scratch = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), bytes, stream), "cuda::moe");
  float* logits = reinterpret_cast<float*>(scratch + at_logits);
  int32_t* list = reinterpret_cast<int32_t*>(scratch + at_list);
  int4* tiles = reinterpret_cast<int4*>(scratch + at_tiles);
  int* tile_count = reinterpret_cast<int*>(scratch + at_count);
  int32_t* slot = tensor ? reinterpret_cast<int32_t*>(scratch + at_slot) : nullptr;
  uint16_t* ye = reinterpret_cast<uint16_t*>(scratch + at_ye);
  uint16_t* ys = reinterpret_cast<uint16_t*>(scratch + at_ys);

  // The shared expert depends on x alone: it runs on a side stream beside the routed experts.
  Branch shared_branch(stream);
  const cudaStream_t side = shared_branch.side();
  if (shared_gemm) {
    float* ys32 = reinterpret_cast<float*>(scratch + at_ys32);
    expert_ffn(x, rows, s1, s2, s3, limit, nullptr, ys32, side);
    to_bf16(ys32, rows * dim, ys, side);  // as combine_kernel reads it
  } else {
    float* hs = reinterpret_cast<float*>(scratch + at_hs);
    const ExpertPointers shared{{s1.data, s2.data, s3.data}, {s1.scale, s2.scale, s3.scale}};
    GroupedArgs sup{nullptr, nullptr, nullptr, rows, 1, x, dim, inter_s, nullptr, shared, nullptr, limit, hs, nullptr};
    grouped<true>(s1.format, dense_tile, sup, dense_tiles, side);
    GroupedArgs sdown{nullptr, nullptr, nullptr, rows, 1, hs, inter_s, dim, nullptr, shared, nullptr, limit, nullptr, ys};
    grouped<false>(s2.format, dense_tile, sdown, dense_tiles, side);
  }

  linear_f32(x, rows, gate, logits, stream);
  const float* b = reinterpret_cast<const float*>(bias.data);
  if (tile == 1) {  // one row, unforced: the route writes its tiles
    launch_route(logits, rows, E, b, opt, experts, weights, stream, forced, vl, image_rows, {list, tiles, tile_count});
  } else {
    route_from_logits(logits, rows, E, b, opt, experts, weights, stream, forced, vl, image_rows);
    const int P = bucket_warps(E);
    bucket_kernel<<<1, kBucketThreads, size_t(1 + P) * size_t(E) * sizeof(int), stream>>>(experts, int(n), E, tile, P,
                                                                                         list, tiles, tile_count, slot);
    check_launch("cuda::moe bucket");
  }

  const auto* table = static_cast<const ExpertPointers*>(routed.device());
  float* h = reinterpret_cast<float*>(scratch + at_h);  // GEMV: [entries, inter]; tensor cores: g [slots, inter]
  if (tensor) {
    // x per entry in slot order → g (in h), u → their SwiGLU act-quantized → ye at the entries' rows.
    // A tile holds one expert's entries: at most one per token, or k when the routing is forced.
    gemm::Tiles t{tiles, tile_count, max_tiles, list, slot, n, std::min<int64_t>(gemm::kTileRows, forced ? n : rows)};
    // Routed, an expert's row count is about binomial (rows, k/E): its mean and two deviations
    // (at bench-1gpu's 16 experts: a 64-row decode → 32, an 80-row turn → 39, so BN 48; V4.1's
    // 384: → 3). Tiles past it take a second CTA (the weights read twice, the second time mostly
    // from L2).
    if (!forced) {
      const double p = double(k) / E, mean = double(rows) * p;
      t.expect = int64_t(std::ceil(mean + 2.0 * std::sqrt(mean * (1.0 - p))));
    }
    const gemm::Tiling tiling = gemm::grouped_tiling(n, E);
    float* u = reinterpret_cast<float*>(scratch + at_u);
    uint16_t* xq = reinterpret_cast<uint16_t*>(scratch + at_xq);
    gemm::act_quant_slots(x, dim, t, k, xq, stream);
    gemm::grouped_up(xq, t, table, routed.w1().format, tiling, dim, inter, h, u, stream);
    gemm::act_quant_swiglu_slots(h, u, inter, t, limit, weights, xq, stream);
    gemm::grouped_down(xq, t, table, routed.w2().format, tiling, inter, dim, ye, stream);
  } else {
    GroupedArgs up{tiles, tile_count, list, 0, k, x, dim, inter, table, {}, weights, limit, h, nullptr};
    grouped<true>(routed.w1().format, tile, up, max_tiles, stream);
    GroupedArgs down{tiles, tile_count, list, 0, k, h, inter, dim, table, {}, nullptr, limit, nullptr, ye};
    grouped<false>(routed.w2().format, tile, down, max_tiles, stream);
  }

  shared_branch.join();
  const dim3 combine_grid{unsigned(rows), unsigned((dim / 4 + kCombineThreads - 1) / kCombineThreads)};
  launch_early("cuda::moe combine", combine_kernel, combine_grid, kCombineThreads, 0, stream, experts, k, E, ye, ys, dim, y);
  check(cudaFreeAsync(scratch, stream), "cuda::moe");
}

}  // namespace dsv41::cuda
