// The lightning indexer over the MXFP4 key cache: scores, top-k, candidate blocks.
//
// Scores: score_mma_kernel (below) for hd 128 and 16, 32 or 48 heads (V4.1: 32), on the tensor
// cores; score_kernel for the other shapes: one thread per key, 256 keys per tile, grid
// (tiles / block, query rows).
// The idea: q and k are both MXFP4, so every product q_c·k_c is (2a)(2b)/4 · s_q·s_k with 2a, 2b
// small integers (e2m1 ×2 ∈ {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}); a 32-block's dot product is then an
// integer sum, done with __dp4a (four int8 products per instruction, exact), times the two
// power-of-two scales. The CPU op sums the same exact products in fp32; both sums are exact as long
// as the block scales of one q·k pair span less than 2^9 (128·144/4 · 2^9 < 2^24), which holds for
// any vector normalized as the forward's are, so the scores are bit-identical to the CPU's (the
// head sum runs in the CPU's order, with its bf16 roundings). The block first fake-quantizes the
// row's q (heads × hd) into shared memory as int8, in the order the key decode produces, then
// stages each tile of 256 keys (contiguous, 17 KB at hd 128) with coalesced word loads. With n on
// the host the grid has one block per tile; with n on the device (graph replay) it is sized for
// n_max, capped at a few blocks per SM that stride over the tiles below n, the rest returning.
// Traffic per query row: n·68 bytes of keys (hd 128) + n·4 of scores; at V4.1's 1M-token context
// (n = 1M entries at m = 1) 68 MB + 4 MB. Work: heads·hd/4 = 1024 dp4a per key (1.07 G at 1M).
// The rows of a prefill chunk each read the keys again (from L2 when they fit there).
//
// Top-k and candidate blocks are a radix select over order-preserving 32-bit keys of the values
// (four passes of 8 bits: a histogram of the keys in the current bucket picks the digit holding the
// k-th largest, until the bucket is taken whole or the key is exact), then an emission that walks
// the row in position order and writes the chosen positions in ascending order, ranks from
// ballots: ties go to the lower position, as on the CPU. Two layouts of the same steps:
//
// - Single block per row (top_kernel, candidate_kernel: 1024 threads): the whole select in one
//   launch, histograms in shared memory. Right when rows fill the GPU (prefill) or n is small.
//   Traffic: up to six reads of the n scores (mostly L2).
// - Many blocks per row (pass_kernel ×4, *_emit_kernel; 512 threads, G blocks of ≥ 4K scores
//   each, up to 2 per SM in all): for a decode step's few rows of up to 1M scores, which one block
//   would leave on one SM of 132. Each pass is one launch: every block histograms its slice in
//   shared memory and adds the non-zero bins to the row's histogram in global memory; the last
//   block to finish (a ticket counter) picks the digit and writes the bucket for the next pass.
//   A pass also notes, per digit, whether its keys differ in the lower bits: bf16 scores are
//   exact after two passes, and the last two return at once. The emit kernel's blocks count their
//   slice against the threshold, publish the counts and add up those of the slices before theirs
//   (a look-back), then emit. 5 launches + a memset of the per-row state; each reads the n scores
//   once (4 MB at 1M, from L2, where the score kernel just left them), the emit kernel twice, so
//   a pass costs little more than its launch. Candidate blocks: pass 0 also makes the block
//   maxima (reading the n scores once), the emit kernel writes the n mask bytes once.
#include "backend/cuda/indexer.h"

#include <algorithm>
#include <string>

#include "backend/cuda/check.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

// ---- scores -----------------------------------------------------------------------------------------

constexpr int kKeysPerBlock = 256;
constexpr int kMaxHeads = 64;

// Four e2m1 codes, one in bits 0-3 of each byte (sign in bit 3) → four int8 holding 2 × the value.
// The magnitudes 2·{0, 0.5, 1, 1.5, 2, 3, 4, 6} are a byte table read with one permute.
__device__ __forceinline__ uint32_t e2m1x4_to_int8x4(uint32_t codes) {
  const uint32_t m = codes & 0x07070707u;
  const uint32_t t = m | (m >> 4);
  const uint32_t selector = (t & 0xFFu) | ((t >> 8) & 0xFF00u);  // the four 3-bit indices as nibbles
  const uint32_t magnitude = __byte_perm(0x03020100u, 0x0C080604u, selector);
  const uint32_t negative = ((codes >> 3) & 0x01010101u) * 0xFFu;
  const uint32_t negated = (0x80808080u - magnitude) ^ 0x80808080u;  // bytewise -m: no byte borrows, m ≤ 12
  return (magnitude & ~negative) | (negated & negative);
}

// round_bf16 (numerics/types.h) bit for bit, NaNs too, without branches: the epilogue of the
// tensor-core scores runs it twice per head and key. (Checked against it on all 2^32 inputs.)
__device__ __forceinline__ float round_bf16_fast(float x) {
  const uint32_t b = __float_as_uint(x);
  const uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  return __uint_as_float((b & 0x7FFFFFFFu) > 0x7F800000u ? (b | 0x00400000u) & 0xFFFF0000u : r);
}

// e8m0_to_float (numerics/types.h) bit for bit without branches: 0 → 2^-127, 255 → NaN.
__device__ __forceinline__ float e8m0_to_float_fast(uint32_t e) {
  return __uint_as_float(e == 0 ? 0x00400000u : e == 255 ? 0x7FC00000u : e << 23);
}

// float(s) for |s| < 2^22 with two full-rate instructions instead of a quarter-rate I2F: s added
// to the mantissa of 1.5·2^23, then 1.5·2^23 taken away, both exact.
__device__ __forceinline__ float small_int_to_float(int s) {
  return __int_as_float(0x4B400000 + s) - 12582912.0f;
}

// Byte position of element c of a vector in the int8 layout the key decode produces: each 4-byte
// word of nibbles (elements 8j..8j+7) becomes int8 word 2j (even elements) and 2j+1 (odd ones).
__device__ __forceinline__ int int8_slot(int c) { return ((c / 8) * 2 + (c & 1)) * 4 + ((c & 7) >> 1); }

// Row r's entry count: a host value for every row, or min(device[r], host) read by the kernel
// (host then the bound n_max).
struct Count {
  const int64_t* device;
  int64_t host;
  __device__ int64_t get(int64_t r) const {
    if (!device) return host;
    const int64_t n = device[r];
    return n < host ? (n > 0 ? n : 0) : host;
  }
  Count from(int64_t r) const { return {device ? device + r : nullptr, host}; }
};

// Row r's key cache: one for every row, or rows[r] (a device array of caches).
struct Keys {
  const uint8_t* shared;
  const uint8_t* const* rows;
  __device__ const uint8_t* get(int64_t r) const { return rows ? rows[r] : shared; }
  Keys from(int64_t r) const { return {shared, rows ? rows + r : nullptr}; }
};

// Grid (blocks, rows), 256 threads; block x takes tiles x, x + gridDim.x, … below n (one tile per
// block when n is on the host). Row r's scores at scores + r·stride.
template <int HD>
__global__ void __launch_bounds__(kKeysPerBlock) score_kernel(const float* q, const float* w, int heads,
                                                              Keys cache, Count entries, int64_t stride,
                                                              const int64_t* visible, float* scores) {
  constexpr int kKeyBytes = int(mxfp4::bytes(HD));  // 17, 34, 68
  constexpr int kWords = HD / 4;                    // int8 words of a vector
  constexpr int kBlocks = HD / mxfp4::kBlock;
  static_assert((kKeysPerBlock * kKeyBytes) % 4 == 0, "each block's keys start on a word");
  __shared__ __align__(16) uint32_t qcodes[kMaxHeads][kWords];
  __shared__ float qscale[kMaxHeads][kBlocks];
  __shared__ float head_weight[kMaxHeads];
  __shared__ uint32_t tile[kKeysPerBlock * kKeyBytes / 4 + 1];  // +1: the funnel read past a key's end

  const int64_t r = blockIdx.y, n = entries.get(r);
  if (int64_t(blockIdx.x) * kKeysPerBlock >= n) return;  // past the entries (n on the device)
  const uint8_t* keys = cache.get(r);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // 1. The row's q → MXFP4 (mxfp4::quantize_dequantize's scale and codes), one warp per 32-block.
  for (int blk = warp; blk < heads * kBlocks; blk += kKeysPerBlock / 32) {
    const int h = blk / kBlocks, b = blk % kBlocks, c = b * mxfp4::kBlock + lane;
    const float v = q[(r * heads + h) * HD + c];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float scale = mxfp4::block_scale(amax);
    reinterpret_cast<int8_t*>(qcodes[h])[int8_slot(c)] = int8_t(2.0f * e2m1_to_float(e2m1_from_float(v / scale)));
    if (lane == 0) qscale[h][b] = scale;
  }
  for (int h = threadIdx.x; h < heads; h += kKeysPerBlock) head_weight[h] = w[r * heads + h];
  const int64_t seen = visible ? visible[r] : n;

  for (int64_t t0 = int64_t(blockIdx.x) * kKeysPerBlock; t0 < n; t0 += int64_t(gridDim.x) * kKeysPerBlock) {
    __syncthreads();  // the previous tile is read

    // 2. The tile's keys, contiguous in the cache, into shared memory.
    const int count = int(n - t0 < kKeysPerBlock ? n - t0 : kKeysPerBlock);
    const int bytes = count * kKeyBytes;
    const uint8_t* first = keys + t0 * kKeyBytes;
    for (int i = threadIdx.x; i < bytes / 4; i += kKeysPerBlock)
      tile[i] = __ldg(reinterpret_cast<const uint32_t*>(first) + i);
    if (threadIdx.x < bytes % 4)
      reinterpret_cast<uint8_t*>(tile)[bytes / 4 * 4 + threadIdx.x] = first[bytes / 4 * 4 + threadIdx.x];
    __syncthreads();  // the tile (and the first time q) is in place
    if (int(threadIdx.x) >= count) continue;

    // 3. This thread's key as int8 codes and block scales.
    const int offset = threadIdx.x * kKeyBytes;
    uint32_t k[kWords];
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
      const int o = offset + 4 * j;
      uint32_t word;
      if constexpr (kKeyBytes % 4 == 0) word = tile[o / 4];
      else word = __funnelshift_r(tile[o / 4], tile[o / 4 + 1], (o % 4) * 8);
      k[2 * j] = e2m1x4_to_int8x4(word & 0x0F0F0F0Fu);
      k[2 * j + 1] = e2m1x4_to_int8x4((word >> 4) & 0x0F0F0F0Fu);
    }
    float kscale[kBlocks];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b)
      kscale[b] = e8m0_to_float(reinterpret_cast<const uint8_t*>(tile)[offset + HD / 2 + b]);

    // 4. Σ_h bf16(relu(bf16(q_h·k)) · w_h) in head order, as the CPU op.
    float sum = 0;
    for (int h = 0; h < heads; ++h) {
      const uint4* qh = reinterpret_cast<const uint4*>(qcodes[h]);
      float dot = 0;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        const uint4 a = qh[2 * b], c = qh[2 * b + 1];
        int s = __dp4a(int(a.x), int(k[8 * b]), 0);
        s = __dp4a(int(a.y), int(k[8 * b + 1]), s);
        s = __dp4a(int(a.z), int(k[8 * b + 2]), s);
        s = __dp4a(int(a.w), int(k[8 * b + 3]), s);
        s = __dp4a(int(c.x), int(k[8 * b + 4]), s);
        s = __dp4a(int(c.y), int(k[8 * b + 5]), s);
        s = __dp4a(int(c.z), int(k[8 * b + 6]), s);
        s = __dp4a(int(c.w), int(k[8 * b + 7]), s);
        dot += float(s) * qscale[h][b] * kscale[b] * 0.25f;  // exact: an integer times powers of two
      }
      const float d = round_bf16(dot);
      sum += round_bf16((d < 0.0f ? 0.0f : d) * head_weight[h]);  // std::max(d, 0.0f), zeros' signs too
    }
    const int64_t t = t0 + threadIdx.x;
    scores[r * stride + t] = t >= seen ? -INFINITY : round_bf16(sum);
  }
}

// ---- scores on the tensor cores (hd 128, 16, 32 or 48 heads: V4.1's 32 × 128) -----------------------
//
// The same integer block sums as score_kernel, from int8 mma.sync (m16n8k32: 16 heads × 8 keys ×
// one 32-block of the dot product, s32 accumulators, exact), so the dp4a work (1024 per key, the
// dp4a kernel's bound: 238 µs at 1M keys on an H200) becomes 8 tensor-core instructions per 8 keys
// and the cost is the fp32 epilogue (145 µs at 1M, 520 GB/s: still the epilogue's instructions,
// about 4 per head, key and 32-block plus two bf16 roundings per head and key, not memory). The k order inside a 32-block is permuted alike on both sides (the integer sum
// does not care): k-slots 4t..4t+3 are the even elements of the block's word t, 16+4t.. the odd
// ones, which is the int8 layout score_kernel already keeps q in (int8_slot) and what one e2m1
// word of a key decodes to. So lane (g, t) of a warp holds, for the whole kernel, the A fragments
// of heads g, g+8 (+16 per head tile) and loads, per key tile, word 4b+t of key g (B fragment);
// its accumulators are heads g, g+8 × keys 2t, 2t+1.
// Epilogue per (head, key): dot = Σ_b float(s_b) · (qscale·kscale/4) in block order (every term
// and partial sum exact under the same condition as score_kernel's, so the order of the power-of-
// two factors does not matter), then bf16(relu(bf16(dot)) · w_h) into shared memory; lane l of the
// warp then sums key l's terms in head order, as the CPU. Grid (blocks, rows), 128 threads; warp
// w of block x takes keys 32·(4x + w) + 128·gridDim.x·i below n. No block-wide barrier after q.
// Traffic: the n keys once (68 B each) + 4 B of score; q, w and the fragments once per block.

constexpr int kMmaThreads = 128;
constexpr int kMmaWarps = kMmaThreads / 32;
constexpr int kMmaKeysPerBlock = 32 * kMmaWarps;

__device__ __forceinline__ void mma_s8(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1,
                                       int& c0, int& c1, int& c2, int& c3) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};\n"
      : "=r"(c0), "=r"(c1), "=r"(c2), "=r"(c3)
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
}

// HT head tiles of 16 (1 to 3). Up to 2 tiles the fragments fit in 128 registers: 4 blocks (16
// warps) per SM.
template <int HT>
__global__ void __launch_bounds__(kMmaThreads, HT <= 2 ? 4 : 1)
    score_mma_kernel(const float* q, const float* w, Keys cache, Count entries, int64_t stride,
                     const int64_t* visible, float* scores) {
  constexpr int HD = 128, kHeads = 16 * HT, kWords = HD / 4, kBlocks = HD / mxfp4::kBlock;
  constexpr int kKeyBytes = int(mxfp4::bytes(HD));  // 68: keys start on a word
  __shared__ __align__(16) uint32_t qcodes[kHeads][kWords];
  __shared__ float qscale[kHeads][kBlocks];
  __shared__ float terms[kMmaWarps][32][kHeads + 1];  // +1: lane l reads row l conflict-free

  const int64_t r = blockIdx.y, n = entries.get(r);
  if (int64_t(blockIdx.x) * kMmaKeysPerBlock >= n) return;  // past the entries (n on the device)
  const uint8_t* keys = cache.get(r);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;

  // 1. The row's q → MXFP4 codes and scales, one warp per 32-block (as score_kernel).
#pragma unroll 4
  for (int blk = warp; blk < kHeads * kBlocks; blk += kMmaWarps) {
    const int h = blk / kBlocks, b = blk % kBlocks, c = b * mxfp4::kBlock + lane;
    const float v = q[(r * kHeads + h) * HD + c];
    float amax = fabsf(v);
    for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float scale = mxfp4::block_scale(amax);
    reinterpret_cast<int8_t*>(qcodes[h])[int8_slot(c)] = int8_t(2.0f * e2m1_to_float(e2m1_from_float(v / scale)));
    if (lane == 0) qscale[h][b] = scale;
  }
  __syncthreads();

  // 2. This lane's A fragments, q scales (×1/4: the codes hold 2× the values) and head weights.
  uint32_t a[HT][kBlocks][4];
  float qs[HT][2][kBlocks], hw[HT][2];
#pragma unroll
  for (int ht = 0; ht < HT; ++ht) {
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int word = 2 * (4 * b + t);
      a[ht][b][0] = qcodes[16 * ht + g][word];
      a[ht][b][1] = qcodes[16 * ht + g + 8][word];
      a[ht][b][2] = qcodes[16 * ht + g][word + 1];
      a[ht][b][3] = qcodes[16 * ht + g + 8][word + 1];
      qs[ht][0][b] = qscale[16 * ht + g][b] * 0.25f;
      qs[ht][1][b] = qscale[16 * ht + g + 8][b] * 0.25f;
    }
    hw[ht][0] = w[r * kHeads + 16 * ht + g];
    hw[ht][1] = w[r * kHeads + 16 * ht + g + 8];
  }
  const int64_t seen = visible ? visible[r] : n;
  float(*my_terms)[kHeads + 1] = terms[warp];

  // 3. The warp's 32 keys at a time: four key tiles of 8.
  for (int64_t k0 = int64_t(blockIdx.x) * kMmaKeysPerBlock + warp * 32; k0 < n;
       k0 += int64_t(gridDim.x) * kMmaKeysPerBlock) {
    uint32_t code[4][kBlocks], scale[4][2];  // all loads of the 32 keys in flight first
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t key = k0 + 8 * j + g;
      const uint32_t* kp = reinterpret_cast<const uint32_t*>(keys + key * kKeyBytes);
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) code[j][b] = key < n ? __ldg(kp + 4 * b + t) : 0u;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t sk = k0 + 8 * j + 2 * t + c;
        scale[j][c] = sk < n ? __ldg(reinterpret_cast<const uint32_t*>(keys + sk * kKeyBytes + HD / 2)) : 0x7F7F7F7Fu;
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float dot[HT][4];
#pragma unroll
      for (int ht = 0; ht < HT; ++ht) dot[ht][0] = dot[ht][1] = dot[ht][2] = dot[ht][3] = 0.0f;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        const uint32_t b0 = e2m1x4_to_int8x4(code[j][b] & 0x0F0F0F0Fu);
        const uint32_t b1 = e2m1x4_to_int8x4((code[j][b] >> 4) & 0x0F0F0F0Fu);
        const float ks0 = e8m0_to_float_fast((scale[j][0] >> (8 * b)) & 0xFFu);
        const float ks1 = e8m0_to_float_fast((scale[j][1] >> (8 * b)) & 0xFFu);
#pragma unroll
        for (int ht = 0; ht < HT; ++ht) {
          int c0, c1, c2, c3;
          mma_s8(a[ht][b][0], a[ht][b][1], a[ht][b][2], a[ht][b][3], b0, b1, c0, c1, c2, c3);
          // |c| ≤ 32·12·12 = 4608: exact as a float; the product is exact, so the fma rounds once.
          dot[ht][0] = __fmaf_rn(small_int_to_float(c0), qs[ht][0][b] * ks0, dot[ht][0]);  // head g, key 2t
          dot[ht][1] = __fmaf_rn(small_int_to_float(c1), qs[ht][0][b] * ks1, dot[ht][1]);  // head g, key 2t+1
          dot[ht][2] = __fmaf_rn(small_int_to_float(c2), qs[ht][1][b] * ks0, dot[ht][2]);  // head g+8, key 2t
          dot[ht][3] = __fmaf_rn(small_int_to_float(c3), qs[ht][1][b] * ks1, dot[ht][3]);  // head g+8, key 2t+1
        }
      }
#pragma unroll
      for (int ht = 0; ht < HT; ++ht)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float d = round_bf16_fast(dot[ht][i]);
          my_terms[8 * j + 2 * t + (i & 1)][16 * ht + g + 8 * (i >> 1)] =
              round_bf16_fast((d < 0.0f ? 0.0f : d) * hw[ht][i >> 1]);  // std::max(d, 0.0f), zeros' signs too
        }
    }
    __syncwarp();
    const int64_t key = k0 + lane;
    if (key < n) {
      float sum = 0;
#pragma unroll 8
      for (int h = 0; h < kHeads; ++h) sum += my_terms[lane][h];
      scores[r * stride + key] = key >= seen ? -INFINITY : round_bf16_fast(sum);
    }
    __syncwarp();  // the terms are rewritten by the next keys
  }
}

// ---- selection: shared pieces -----------------------------------------------------------------------

constexpr int kSelectThreads = 1024;  // the single-block kernels
constexpr int kPassThreads = 512;     // each block of the many-block kernels
constexpr int64_t kScoresPerBlock = 4096;  // the many-block layout's target slice (of scores)
constexpr int64_t kMinSlice = 512;         // values; a small n on the device leaves later blocks idle
constexpr int kMinBlocks = 8;              // fewer blocks per row than this: one block per row

// Unsigned keys in the order of the floats; -0 and +0 are one key, as they compare equal on the CPU.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7FFFFFFFu) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The selection: every key whose top bits (mask) exceed prefix, and the first `take_equal` (in
// position order) whose top bits equal it. mask is the bits the passes have fixed: all 32 unless
// a bucket was found to be taken whole earlier.
struct Threshold {
  uint32_t prefix, mask;
  int64_t take_equal;
};

// One radix step: which digit at `shift` holds the remaining-th largest key of the bucket.
struct Digit {
  uint32_t prefix;     // the bucket narrowed by the digit
  long long remaining;  // keys still to take from it
  int whole;           // it holds exactly `remaining` keys: taken whole, later passes have nothing to do
};

// Run by warp 0 alone: lane l holds digits 8l..8l+7 of hist (the bucket's 256 counts); suffix sums
// over lanes say which lane's digits cross `remaining` (≥ 1, ≤ the bucket's count), that lane
// finds the digit and writes *out.
__device__ void choose_digit(const uint32_t* hist, uint32_t prefix, int shift, int64_t remaining, Digit* out) {
  const int lane = threadIdx.x % 32;
  uint32_t c[8], total = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) total += (c[j] = hist[8 * lane + j]);
  uint32_t suffix = total;
  for (int o = 1; o < 32; o *= 2) {
    const uint32_t v = __shfl_down_sync(0xFFFFFFFFu, suffix, o);
    if (lane + o < 32) suffix += v;
  }
  const int64_t above = int64_t(suffix) - total;  // keys in higher lanes' digits
  if (above < remaining && above + total >= remaining) {
    int64_t a = above;
    int j = 7;
    for (; j > 0; --j) {
      if (a + c[j] >= remaining) break;
      a += c[j];
    }
    out->prefix = prefix | (uint32_t(8 * lane + j) << shift);
    out->remaining = remaining - a;
    out->whole = int64_t(c[j]) == remaining - a;
  }
}

// Calls emit(i, rank) for every selected position i of s[0, n), rank0 + its place in ascending
// position order. Warp w walks positions [w·chunk, (w+1)·chunk) 32 at a time: one pass counting
// each warp's keys above / equal, one emitting with ballots. All threads of the block call it.
template <int kThreads, typename Emit>
__device__ void emit_selected(const float* s, int64_t n, Threshold th, int64_t rank0, Emit emit) {
  constexpr int kWarps = kThreads / 32;
  __shared__ long long warp_above[kWarps], warp_equal[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunk = (n + kWarps - 1) / kWarps;
  const int64_t begin = warp * chunk < n ? warp * chunk : n, end = begin + chunk < n ? begin + chunk : n;
  int64_t above = 0, equal = 0;
  for (int64_t i = begin + lane; i < end; i += 32) {
    const uint32_t key = order_key(s[i]) & th.mask;
    above += key > th.prefix;
    equal += key == th.prefix;
  }
  for (int o = 16; o > 0; o /= 2) {
    above += __shfl_xor_sync(0xFFFFFFFFu, above, o);
    equal += __shfl_xor_sync(0xFFFFFFFFu, equal, o);
  }
  if (lane == 0) warp_above[warp] = above, warp_equal[warp] = equal;
  __syncthreads();
  int64_t rank = rank0, equal_seen = 0;
  for (int v = 0; v < warp; ++v) rank += warp_above[v], equal_seen += warp_equal[v];
  rank += equal_seen < th.take_equal ? equal_seen : th.take_equal;
  const uint32_t lower = (1u << lane) - 1;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t i = base + lane;
    const uint32_t key = i < end ? order_key(s[i]) & th.mask : 0;
    const bool eq = i < end && key == th.prefix;
    const uint32_t eq_mask = __ballot_sync(0xFFFFFFFFu, eq);
    const bool take = (i < end && key > th.prefix) || (eq && equal_seen + __popc(eq_mask & lower) < th.take_equal);
    const uint32_t take_mask = __ballot_sync(0xFFFFFFFFu, take);
    if (take) emit(i, rank + __popc(take_mask & lower));
    rank += __popc(take_mask);
    equal_seen += __popc(eq_mask);
  }
  __syncthreads();  // warp_above / warp_equal free again
}

// ---- selection: one block per row -------------------------------------------------------------------

// Radix select over s[0, n) by the whole block: the k-th largest key (1 ≤ k ≤ n), as a Threshold.
// Each pass reads the n values once (L2 after the first), a shared-memory histogram.
__device__ Threshold select_threshold(const float* s, int64_t n, int64_t k) {
  __shared__ uint32_t hist[256];
  __shared__ Digit chosen;
  uint32_t prefix = 0, mask = 0;
  int64_t remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = order_key(s[i]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) choose_digit(hist, prefix, shift, remaining, &chosen);
    __syncthreads();
    prefix = chosen.prefix;
    remaining = chosen.remaining;
    mask |= 0xFFu << shift;
    const bool whole = chosen.whole;
    __syncthreads();  // hist and chosen are rewritten by the next pass
    if (whole) break;
  }
  return {prefix, mask, remaining};
}

// Grid rows, 1024 threads: row r's top positions. Scores at r·stride, positions at r·k.
__global__ void __launch_bounds__(kSelectThreads) top_kernel(const float* scores, Count entries, int64_t stride, int k,
                                                             int32_t* positions) {
  const int64_t n = entries.get(blockIdx.x);
  const float* s = scores + blockIdx.x * stride;
  int32_t* out = positions + int64_t(blockIdx.x) * k;
  const int64_t take = k < n ? k : n;
  for (int64_t i = take + threadIdx.x; i < k; i += kSelectThreads) out[i] = -1;
  if (take <= 0) return;
  const Threshold th = select_threshold(s, n, take);
  emit_selected<kSelectThreads>(s, n, th, 0, [&](int64_t i, int64_t rank) { out[rank] = int32_t(i); });
}

// Grid rows, 1024 threads: row r's candidate mask. block_scores / chosen: scratch [rows, blocks_stride];
// scores and mask at r·stride.
__global__ void __launch_bounds__(kSelectThreads) candidate_kernel(const float* scores, Count entries, int64_t stride,
                                                                   const int64_t* compress_len, int topk_blocks,
                                                                   int block_size, float* block_scores,
                                                                   uint8_t* chosen, int64_t blocks_stride, uint8_t* mask) {
  const int64_t r = blockIdx.x, n = entries.get(r), blocks = (n + block_size - 1) / block_size;
  if (n <= 0) return;
  const float* s = scores + r * stride;
  float* bs = block_scores + r * blocks_stride;
  uint8_t* ch = chosen + r * blocks_stride;
  const int64_t len = compress_len[r];
  const int64_t pinned = len > 0 ? (len - 1) / block_size : -1;  // the newest, partly filled block
  for (int64_t b = threadIdx.x; b < blocks; b += kSelectThreads) {
    float m = -INFINITY;
    for (int64_t t = b * block_size; t < n && t < (b + 1) * block_size; ++t) m = m < s[t] ? s[t] : m;  // std::max
    bs[b] = b == pinned ? INFINITY : m;
    ch[b] = 0;
  }
  __syncthreads();
  const int64_t take = topk_blocks < blocks ? topk_blocks : blocks;
  if (take > 0) {
    const Threshold th = select_threshold(bs, blocks, take);
    emit_selected<kSelectThreads>(bs, blocks, th, 0, [&](int64_t b, int64_t) { ch[b] = 1; });
  }
  __syncthreads();
  for (int64_t t = threadIdx.x; t < n; t += kSelectThreads) {
    const int64_t b = t / block_size;
    mask[r * stride + t] = ch[b] && bs[b] != -INFINITY;  // fewer reachable blocks than topk_blocks
  }
}

// ---- selection: many blocks per row -----------------------------------------------------------------

// Per row, in scratch zeroed before the first pass.
struct SelectState {
  uint32_t hist[4][256];      // pass p's histogram of the row, summed by the blocks' atomics
  uint32_t low_or[3][256];    // pass p, per digit: OR of the bits below the digit over its keys,
  uint32_t low_nor[3][256];   //   and OR of their complements: both 0 in every bit = one key value
  uint32_t ticket;            // blocks of the current pass done; the last resets it
  uint32_t prefix, mask;      // the bucket after the passes so far
  int whole;                  // the bucket is taken whole or holds one key: later passes return at once
  long long remaining;        // keys still to take from the bucket
  uint32_t emit_ticket;       // the emit kernel's blocks in the order they start
};

// What the many-block kernels select over. Row r: `values` at r·values_stride, count(n) of them,
// take min(k, count). Top-k: the scores themselves (per 1). Candidate blocks: the block maxima
// (per = block size), which pass 0 makes from the scores (at r·scores_stride) and stores.
struct SelectRows {
  const float* values;
  int64_t values_stride;
  Count entries;  // scores per row
  int per;
  int64_t k;
  SelectState* state;           // [rows]
  unsigned long long* counts;   // [rows, gridDim.x], zeroed: each slice's (above + 1, equal) once known
  // candidate blocks only:
  const float* scores;
  int64_t scores_stride;
  const int64_t* compress_len;
  float* made;  // = values, writable

  __device__ int64_t count(int64_t n) const { return (n + per - 1) / per; }
};

struct Slice {
  int64_t begin, end;
};

// Slice b of [0, count) among gridDim.x: equal slices of at least kMinSlice, the last ones empty
// when count is small.
__device__ __forceinline__ Slice slice_of(int64_t count, int64_t b) {
  int64_t size = (count + gridDim.x - 1) / gridDim.x;
  size = size > kMinSlice ? size : kMinSlice;
  const int64_t begin = b * size < count ? b * size : count;
  return {begin, begin + size < count ? begin + size : count};
}

// Sums v over the block into *total (shared, zeroed by the caller and synced).
__device__ __forceinline__ void block_add(long long v, unsigned long long* total) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if (threadIdx.x % 32 == 0 && v) atomicAdd(total, static_cast<unsigned long long>(v));
}

// Pass at `shift` (24, 16, 8, 0), grid (G, rows), kPassThreads: histogram of the slice's keys in
// the bucket → the row's histogram, with, per digit, whether its keys differ below it; the last
// block picks the digit, and when the chosen digit's keys are one value (bf16 scores: after the
// 16-bit pass) or all taken, the later passes return at once. kMake (candidate pass 0): the values
// are made as they are read (the max of each block of scores; the newest block +inf) and stored.
// Reads: the slice once (pass 0 of candidates: its scores once).
template <bool kMake>
__global__ void __launch_bounds__(kPassThreads) pass_kernel(SelectRows m, int shift) {
  __shared__ uint32_t hist[256], low_or[256], low_nor[256];
  __shared__ Digit chosen;
  __shared__ bool last;
  const int64_t r = blockIdx.y, n = m.entries.get(r), count = m.count(n), take = m.k < count ? m.k : count;
  if (take <= 0) return;  // (every block of the row alike)
  SelectState* st = m.state + r;
  if (shift < 24 && st->whole) return;
  const uint32_t prefix = shift < 24 ? st->prefix : 0, mask = shift < 24 ? st->mask : 0;
  const uint32_t low_mask = (1u << shift) - 1;  // shift 0: none
  const int64_t remaining = shift < 24 ? st->remaining : take;
  const int pass = 3 - shift / 8;

  for (int i = threadIdx.x; i < 256; i += kPassThreads) hist[i] = low_or[i] = low_nor[i] = 0;
  __syncthreads();
  const Slice sl = slice_of(count, blockIdx.x);
  const float* v = m.values + r * m.values_stride;
  const float* s = m.scores + r * m.scores_stride;
  int64_t pinned = -1;
  if constexpr (kMake) {
    const int64_t len = m.compress_len[r];
    pinned = len > 0 ? (len - 1) / m.per : -1;
  }
  for (int64_t base = sl.begin; base < sl.end; base += 4 * kPassThreads) {
    float x[4];  // four loads in flight before the first atomic
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = base + j * kPassThreads + threadIdx.x;
      if (i >= sl.end) continue;
      if constexpr (kMake) {
        float mx = -INFINITY;
        for (int64_t t = i * m.per; t < n && t < (i + 1) * m.per; ++t) mx = mx < s[t] ? s[t] : mx;  // std::max
        x[j] = i == pinned ? INFINITY : mx;
        m.made[r * m.values_stride + i] = x[j];
      } else {
        x[j] = v[i];
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t i = base + j * kPassThreads + threadIdx.x;
      if (i >= sl.end) continue;
      const uint32_t key = order_key(x[j]);
      if ((key & mask) != prefix) continue;
      const uint32_t d = (key >> shift) & 0xFFu;
      atomicAdd(&hist[d], 1u);
      if (low_mask) {
        if (key & low_mask) atomicOr(&low_or[d], key & low_mask);
        if (~key & low_mask) atomicOr(&low_nor[d], ~key & low_mask);
      }
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += kPassThreads)
    if (hist[i]) {
      atomicAdd(&st->hist[pass][i], hist[i]);
      if (low_or[i]) atomicOr(&st->low_or[pass][i], low_or[i]);
      if (low_nor[i]) atomicOr(&st->low_nor[pass][i], low_nor[i]);
    }
  __threadfence();  // this block's bins before its ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&st->ticket, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;

  // The last block: the row's histogram is complete.
  __threadfence();
  for (int i = threadIdx.x; i < 256; i += kPassThreads) hist[i] = __ldcg(&st->hist[pass][i]);
  __syncthreads();
  if (threadIdx.x < 32) choose_digit(hist, prefix, shift, remaining, &chosen);
  __syncthreads();
  if (threadIdx.x == 0) {
    const uint32_t d = (chosen.prefix >> shift) & 0xFFu;
    const bool one_value = !low_mask || (__ldcg(&st->low_or[pass][d]) & __ldcg(&st->low_nor[pass][d])) == 0;
    st->prefix = chosen.prefix;
    st->mask = mask | (0xFFu << shift);
    st->remaining = chosen.remaining;
    st->whole = chosen.whole || one_value;
    st->ticket = 0;
  }
}

// The emission of one slice of row r, grid (G, rows), kPassThreads: blocks take slices in the
// order they start (a ticket), count their keys above / equal to the final threshold, publish
// the counts, and add up those of the slices before theirs as they appear (a look-back: each
// waits only on blocks that started before it, so it cannot deadlock). The ranks of the slice
// then start after the positions the slices before it take, and it may take the keys equal to the
// threshold that those left. emit(i, rank) with i the row's position. Reads the slice twice (L2).
// Returns the slice.
template <typename Emit>
__device__ Slice emit_slice(const SelectRows& m, int64_t r, int64_t count, int64_t take, Emit emit) {
  __shared__ unsigned long long sums[4];  // this slice's above, equal; the earlier slices' above, equal
  __shared__ unsigned slot;
  SelectState* st = m.state + r;
  if (threadIdx.x == 0) slot = atomicAdd(&st->emit_ticket, 1u);
  if (threadIdx.x < 4) sums[threadIdx.x] = 0;
  __syncthreads();
  const int64_t b = slot;
  const Slice sl = slice_of(count, b);
  if (take <= 0) return sl;
  Threshold th{st->prefix, st->mask, st->remaining};
  const float* v = m.values + r * m.values_stride;
  long long above = 0, equal = 0;
  for (int64_t i = sl.begin + threadIdx.x; i < sl.end; i += kPassThreads) {
    const uint32_t key = order_key(v[i]) & th.mask;
    above += key > th.prefix;
    equal += key == th.prefix;
  }
  block_add(above, &sums[0]);
  block_add(equal, &sums[1]);
  __syncthreads();
  volatile unsigned long long* counts = m.counts + r * gridDim.x;
  if (threadIdx.x == 0) counts[b] = (sums[0] + 1) << 32 | sums[1];  // one 64-bit store: published whole
  above = equal = 0;
  for (int64_t e = threadIdx.x; e < b; e += kPassThreads) {
    unsigned long long c;
    while ((c = counts[e]) == 0) {
    }
    above += static_cast<long long>(c >> 32) - 1, equal += static_cast<long long>(c & 0xFFFFFFFFu);
  }
  block_add(above, &sums[2]);
  block_add(equal, &sums[3]);
  __syncthreads();
  const int64_t equal_before = int64_t(sums[3]);
  const int64_t rank0 = int64_t(sums[2]) + (equal_before < th.take_equal ? equal_before : th.take_equal);
  th.take_equal = equal_before < th.take_equal ? th.take_equal - equal_before : 0;
  emit_selected<kPassThreads>(v + sl.begin, sl.end - sl.begin, th, rank0,
                              [&](int64_t i, int64_t rank) { emit(sl.begin + i, rank); });
  return sl;
}

// Grid (G, rows), kPassThreads: row r's top positions from its slices; block 0 writes the -1 tail.
__global__ void __launch_bounds__(kPassThreads) top_emit_kernel(SelectRows m, int k, int32_t* positions) {
  const int64_t r = blockIdx.y, count = m.count(m.entries.get(r)), take = k < count ? k : count;
  int32_t* out = positions + r * k;
  if (blockIdx.x == 0)
    for (int64_t i = (take > 0 ? take : 0) + threadIdx.x; i < k; i += kPassThreads) out[i] = -1;
  if (take <= 0) return;
  emit_slice(m, r, count, take, [&](int64_t i, int64_t rank) { out[rank] = int32_t(i); });
}

// Grid (G, rows), kPassThreads: the chosen flags of the slice's blocks (chosen [rows, values_stride],
// zeroed), then the mask bytes of the positions they cover (mask at r·mask_stride). Writes the
// slice's mask bytes once, coalesced.
__global__ void __launch_bounds__(kPassThreads) candidate_emit_kernel(SelectRows m, uint8_t* chosen, uint8_t* mask,
                                                                      int64_t mask_stride) {
  const int64_t r = blockIdx.y, n = m.entries.get(r), count = m.count(n), take = m.k < count ? m.k : count;
  uint8_t* ch = chosen + r * m.values_stride;
  const Slice sl = emit_slice(m, r, count, take, [&](int64_t b, int64_t) { ch[b] = 1; });
  __syncthreads();  // the flags
  const float* v = m.values + r * m.values_stride;
  const int64_t t_end = sl.end * m.per < n ? sl.end * m.per : n;
  for (int64_t t = sl.begin * m.per + threadIdx.x; t < t_end; t += kPassThreads) {
    const int64_t b = t / m.per;
    mask[r * mask_stride + t] = take > 0 && ch[b] && v[b] != -INFINITY;  // fewer reachable blocks than topk_blocks
  }
}

}  // namespace

// ---- host --------------------------------------------------------------------------------------------

namespace {

// The tensor-core kernel in one wave: as many blocks per row as fit on the GPU at once.
template <int HT>
void mma_launch(const float* q, const float* w, int64_t rows, Keys keys, Count entries, int64_t stride,
                int64_t n_max, const int64_t* visible, float* scores, int64_t sms, cudaStream_t stream) {
  static const int per_sm = [] {
    int b = 0;
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, score_mma_kernel<HT>, kMmaThreads, 0), "cuda::index_scores");
    return std::max(b, 1);
  }();
  const int64_t tiles = (n_max + kMmaKeysPerBlock - 1) / kMmaKeysPerBlock;
  const dim3 grid{unsigned(std::min(tiles, std::max<int64_t>(1, per_sm * sms / rows))), unsigned(rows)};
  score_mma_kernel<HT><<<grid, kMmaThreads, 0, stream>>>(q, w, keys, entries, stride, visible, scores);
}

// n_max: the most entries a row can have (n itself when on the host). capped: the dp4a kernel gets
// at most a few blocks per SM per row, as the tensor-core kernel always does; else one per tile.
// Rows go in launches of at most 65535 (the grid's y).
void score_launch(const float* q, const float* w, int64_t rows, int heads, int hd, Keys keys, Count entries,
                  int64_t stride, int64_t n_max, bool capped, const int64_t* visible, float* scores,
                  cudaStream_t stream) {
  if (heads <= 0 || heads > kMaxHeads) fail("cuda::index_scores", "1 to 64 heads", std::to_string(heads));
  if (reinterpret_cast<uintptr_t>(keys.shared) % 4 != 0) fail("cuda::index_scores", "a 4-byte aligned key cache", "unaligned");
  constexpr int64_t kMaxRows = 65535;
  for (int64_t r0 = kMaxRows; r0 < rows; r0 += kMaxRows)
    score_launch(q + r0 * heads * hd, w + r0 * heads, std::min(kMaxRows, rows - r0), heads, hd, keys.from(r0),
                 entries.from(r0), stride, n_max, capped, visible ? visible + r0 : nullptr, scores + r0 * stride, stream);
  rows = std::min(rows, kMaxRows);
  // A few blocks per SM, each striding over its tiles (q made once per block, no wave of empty
  // blocks while n on the device is far below n_max); one block per tile when n is on the host
  // and small enough that the cap would not bind.
  const int64_t sms = multiprocessors("cuda indexer"), cap = std::max<int64_t>(1, 4 * sms / rows);
  if (hd == 128 && heads % 16 == 0 && heads <= 48) {
    switch (heads / 16) {
      case 1: mma_launch<1>(q, w, rows, keys, entries, stride, n_max, visible, scores, sms, stream); break;
      case 2: mma_launch<2>(q, w, rows, keys, entries, stride, n_max, visible, scores, sms, stream); break;
      default: mma_launch<3>(q, w, rows, keys, entries, stride, n_max, visible, scores, sms, stream);
    }
    check_launch("cuda::index_scores");
    return;
  }
  const int64_t tiles = (n_max + kKeysPerBlock - 1) / kKeysPerBlock;
  const dim3 grid{unsigned(capped ? std::min(tiles, cap) : tiles), unsigned(rows)};
  switch (hd) {
    case 32: score_kernel<32><<<grid, kKeysPerBlock, 0, stream>>>(q, w, heads, keys, entries, stride, visible, scores); break;
    case 64: score_kernel<64><<<grid, kKeysPerBlock, 0, stream>>>(q, w, heads, keys, entries, stride, visible, scores); break;
    case 128: score_kernel<128><<<grid, kKeysPerBlock, 0, stream>>>(q, w, heads, keys, entries, stride, visible, scores); break;
    default: fail("cuda::index_scores", "index head dim 32, 64 or 128", std::to_string(hd));
  }
  check_launch("cuda::index_scores");
}

// Blocks per row of the many-block select for rows × n_max scores; 1: the single-block kernels.
int select_blocks(int64_t rows, int64_t n_max) {
  if (rows > 65535) return 1;
  const int64_t cap = 2 * int64_t(multiprocessors("cuda indexer")) / rows;
  int64_t g = (n_max + kScoresPerBlock - 1) / kScoresPerBlock;
  g = g < cap ? g : cap;
  return g >= kMinBlocks ? int(g) : 1;
}

// Scratch of the many-block select: the states, the slice counts and `zeroed` more bytes (at
// *zeroed_at), all zeroed here in the stream, then `extra` bytes (at *extra_at); one allocation,
// returned for cudaFreeAsync.
uint8_t* select_scratch(int64_t rows, int g, size_t zeroed, size_t extra, SelectRows& m, uint8_t** zeroed_at,
                        uint8_t** extra_at, cudaStream_t stream, const char* op) {
  const auto round = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  const size_t states = round(size_t(rows) * sizeof(SelectState)), counts = round(size_t(rows) * g * 8);
  keep_scratch_pool();
  uint8_t* p = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&p), states + counts + round(zeroed) + extra, stream), op);
  check(cudaMemsetAsync(p, 0, states + counts + zeroed, stream), op);
  m.state = reinterpret_cast<SelectState*>(p);
  m.counts = reinterpret_cast<unsigned long long*>(p + states);
  *zeroed_at = p + states + counts;
  *extra_at = *zeroed_at + round(zeroed);
  return p;
}

// The four passes of the many-block select (pass 0 makes the values when kMake).
template <bool kMake>
void select_passes(const SelectRows& m, int64_t rows, int g, cudaStream_t stream, const char* op) {
  const dim3 grid{unsigned(g), unsigned(rows)};
  pass_kernel<kMake><<<grid, kPassThreads, 0, stream>>>(m, 24);
  for (int shift = 16; shift >= 0; shift -= 8) pass_kernel<false><<<grid, kPassThreads, 0, stream>>>(m, shift);
  check_launch(op);
}

void top_launch(const float* scores, int64_t rows, Count entries, int64_t stride, int64_t n_max, int k,
                int32_t* positions, cudaStream_t stream) {
  const char* op = "cuda::top_positions";
  if (n_max >= (int64_t(1) << 31)) fail(op, "fewer than 2^31 positions", std::to_string(n_max));
  const int g = select_blocks(rows, n_max);
  if (g == 1) {
    top_kernel<<<unsigned(rows), kSelectThreads, 0, stream>>>(scores, entries, stride, k, positions);
    check_launch(op);
    return;
  }
  SelectRows m{};
  m.values = scores, m.values_stride = stride, m.entries = entries, m.per = 1, m.k = k;
  uint8_t *zeroed = nullptr, *extra = nullptr;
  uint8_t* scratch = select_scratch(rows, g, 0, 0, m, &zeroed, &extra, stream, op);
  select_passes<false>(m, rows, g, stream, op);
  top_emit_kernel<<<dim3(unsigned(g), unsigned(rows)), kPassThreads, 0, stream>>>(m, k, positions);
  check_launch(op);
  check(cudaFreeAsync(scratch, stream), op);
}

void candidate_launch(const float* scores, int64_t rows, Count entries, int64_t stride, int64_t n_max,
                      const int64_t* compress_len, int topk_blocks, int block_size, uint8_t* mask, cudaStream_t stream) {
  const char* op = "cuda::candidate_mask";
  if (block_size <= 0) fail(op, "a positive block size", std::to_string(block_size));
  const int64_t blocks = (n_max + block_size - 1) / block_size;  // per row, at most
  const size_t values = (size_t(rows * blocks) * sizeof(float) + 255) / 256 * 256;
  const int g = select_blocks(rows, n_max);
  if (g == 1) {
    keep_scratch_pool();
    uint8_t* scratch = nullptr;
    check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), values + size_t(rows * blocks), stream), op);
    candidate_kernel<<<unsigned(rows), kSelectThreads, 0, stream>>>(scores, entries, stride, compress_len, topk_blocks,
                                                                   block_size, reinterpret_cast<float*>(scratch),
                                                                   scratch + values, blocks, mask);
    check_launch(op);
    check(cudaFreeAsync(scratch, stream), op);
    return;
  }
  SelectRows m{};
  m.values_stride = blocks, m.entries = entries, m.per = block_size, m.k = topk_blocks;
  m.scores = scores, m.scores_stride = stride, m.compress_len = compress_len;
  uint8_t *chosen = nullptr, *extra = nullptr;
  uint8_t* scratch = select_scratch(rows, g, size_t(rows * blocks), values, m, &chosen, &extra, stream, op);
  m.made = reinterpret_cast<float*>(extra);
  m.values = m.made;
  select_passes<true>(m, rows, g, stream, op);
  candidate_emit_kernel<<<dim3(unsigned(g), unsigned(rows)), kPassThreads, 0, stream>>>(m, chosen, mask, stride);
  check_launch(op);
  check(cudaFreeAsync(scratch, stream), op);
}

}  // namespace

void index_scores(const float* q, const float* w, int64_t rows, int heads, int hd, const uint8_t* keys, int64_t n,
                  const int64_t* visible, float* scores, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  score_launch(q, w, rows, heads, hd, Keys{keys, nullptr}, Count{nullptr, n}, n, n, false, visible, scores, stream);
}

void index_scores(const float* q, const float* w, int64_t rows, int heads, int hd, const uint8_t* const* keys,
                  const int64_t* n_device, int64_t n_max, const int64_t* visible, float* scores, cudaStream_t stream) {
  if (rows <= 0 || n_max <= 0) return;
  if (!n_device || !keys) fail("cuda::index_scores", "device entry counts and key caches per row", "null");
  score_launch(q, w, rows, heads, hd, Keys{nullptr, keys}, Count{n_device, n_max}, n_max, n_max, true, visible, scores,
               stream);
}

void top_positions(const float* scores, int64_t rows, int64_t n, int k, int32_t* positions, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  top_launch(scores, rows, Count{nullptr, n}, n, n, k, positions, stream);
}

void top_positions(const float* scores, int64_t rows, const int64_t* n_device, int64_t n_max, int k,
                   int32_t* positions, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  if (!n_device) fail("cuda::top_positions", "a device entry count", "null");
  top_launch(scores, rows, Count{n_device, n_max}, n_max, n_max, k, positions, stream);
}

void candidate_mask(const float* scores, int64_t rows, int64_t n, const int64_t* compress_len, int topk_blocks,
                    int block_size, uint8_t* mask, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  candidate_launch(scores, rows, Count{nullptr, n}, n, n, compress_len, topk_blocks, block_size, mask, stream);
}

void candidate_mask(const float* scores, int64_t rows, const int64_t* n_device, int64_t n_max,
                    const int64_t* compress_len, int topk_blocks, int block_size, uint8_t* mask, cudaStream_t stream) {
  if (rows <= 0 || n_max <= 0) return;
  if (!n_device) fail("cuda::candidate_mask", "a device entry count", "null");
  candidate_launch(scores, rows, Count{n_device, n_max}, n_max, n_max, compress_len, topk_blocks, block_size, mask,
                   stream);
}

}  // namespace dsv41::cuda
