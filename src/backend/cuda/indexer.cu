// The lightning indexer over the MXFP4 key cache: scores, top-k, candidate blocks.
//
// Scores (score_kernel): one thread per key, 256 keys per block, grid (keys / 256, query rows).
// The idea: q and k are both MXFP4, so every product q_c·k_c is (2a)(2b)/4 · s_q·s_k with 2a, 2b
// small integers (e2m1 ×2 ∈ {0, ±1, ±2, ±3, ±4, ±6, ±8, ±12}); a 32-block's dot product is then an
// integer sum, done with __dp4a (four int8 products per instruction, exact), times the two
// power-of-two scales. The CPU op sums the same exact products in fp32; both sums are exact as long
// as the block scales of one q·k pair span less than 2^9 (128·144/4 · 2^9 < 2^24), which holds for
// any vector normalized as the forward's are, so the scores are bit-identical to the CPU's (the
// head sum runs in the CPU's order, with its bf16 roundings). The block first fake-quantizes the
// row's q (heads × hd) into shared memory as int8, in the order the key decode produces, then
// stages its 256 keys (contiguous, 17 KB at hd 128) with coalesced word loads.
// Traffic per query row: n·68 bytes of keys (hd 128) + n·4 of scores; at V4.1's 1M-token context
// (n = 1M entries at m = 1) 68 MB + 4 MB. Work: heads·hd/4 = 1024 dp4a per key (1.07 G at 1M).
// The rows of a prefill chunk each read the keys again (from L2 when they fit there).
//
// Top-k (top_kernel) and candidate blocks (candidate_kernel): one block of 1024 threads per query
// row. A radix select over order-preserving 32-bit keys of the scores (four passes of 8 bits with
// a shared-memory histogram) finds the k-th largest key T and how many of the keys equal to T to
// take; then each warp walks its 1/32 of the row in coalesced steps and emits the chosen positions
// in ascending order, ranks from ballots: ties go to the lower position, as on the CPU. Traffic: six
// reads of the n scores (mostly L2). One block per row keeps a batch-1 decode on one SM.
#include "backend/cuda/indexer.h"

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
  return __vsub4(magnitude ^ negative, negative);  // bytewise: -m where the sign is set
}

// Byte position of element c of a vector in the int8 layout the key decode produces: each 4-byte
// word of nibbles (elements 8j..8j+7) becomes int8 word 2j (even elements) and 2j+1 (odd ones).
__device__ __forceinline__ int int8_slot(int c) { return ((c / 8) * 2 + (c & 1)) * 4 + ((c & 7) >> 1); }

template <int HD>
__global__ void __launch_bounds__(kKeysPerBlock) score_kernel(const float* q, const float* w, int heads,
                                                              const uint8_t* keys, int64_t n, const int64_t* visible,
                                                              float* scores) {
  constexpr int kKeyBytes = int(mxfp4::bytes(HD));  // 17, 34, 68
  constexpr int kWords = HD / 4;                    // int8 words of a vector
  constexpr int kBlocks = HD / mxfp4::kBlock;
  static_assert((kKeysPerBlock * kKeyBytes) % 4 == 0, "each block's keys start on a word");
  __shared__ __align__(16) uint32_t qcodes[kMaxHeads][kWords];
  __shared__ float qscale[kMaxHeads][kBlocks];
  __shared__ float head_weight[kMaxHeads];
  __shared__ uint32_t tile[kKeysPerBlock * kKeyBytes / 4 + 1];  // +1: the funnel read past a key's end

  const int64_t r = blockIdx.y, t0 = int64_t(blockIdx.x) * kKeysPerBlock;
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

  // 2. The block's keys, contiguous in the cache, into shared memory.
  const int count = int(n - t0 < kKeysPerBlock ? n - t0 : kKeysPerBlock);
  const int bytes = count * kKeyBytes;
  const uint8_t* first = keys + t0 * kKeyBytes;
  for (int i = threadIdx.x; i < bytes / 4; i += kKeysPerBlock) tile[i] = __ldg(reinterpret_cast<const uint32_t*>(first) + i);
  if (threadIdx.x < bytes % 4)
    reinterpret_cast<uint8_t*>(tile)[bytes / 4 * 4 + threadIdx.x] = first[bytes / 4 * 4 + threadIdx.x];
  __syncthreads();
  if (int(threadIdx.x) >= count) return;

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
  for (int b = 0; b < kBlocks; ++b) kscale[b] = e8m0_to_float(reinterpret_cast<const uint8_t*>(tile)[offset + HD / 2 + b]);

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
  scores[r * n + t] = visible && t >= visible[r] ? -INFINITY : round_bf16(sum);
}

// ---- selection --------------------------------------------------------------------------------------

constexpr int kSelectThreads = 1024;
constexpr int kSelectWarps = kSelectThreads / 32;

// Unsigned keys in the order of the floats; -0 and +0 are one key, as they compare equal on the CPU.
__device__ __forceinline__ uint32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
  if ((b & 0x7FFFFFFFu) == 0) b = 0;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Every key above `key` is taken, and the first `take_equal` (in position order) equal to it.
struct Threshold {
  uint32_t key;
  int64_t take_equal;
};

// Radix select over s[0, n) by the whole block: the k-th largest key (1 ≤ k ≤ n).
__device__ Threshold select_threshold(const float* s, int64_t n, int64_t k) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t chosen_prefix;
  __shared__ long long chosen_remaining;
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
    // Warp 0 finds the digit holding the remaining-th largest: lane l holds digits 8l..8l+7; the
    // suffix sums over lanes say which lane's digits cross `remaining`, that lane finds the digit.
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
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
        chosen_prefix = prefix | (uint32_t(8 * lane + j) << shift);
        chosen_remaining = remaining - a;
      }
    }
    __syncthreads();
    prefix = chosen_prefix;
    remaining = chosen_remaining;
    mask |= 0xFFu << shift;
    __syncthreads();  // hist and the chosen_* are rewritten by the next pass
  }
  return {prefix, remaining};
}

// Calls emit(i, rank) for every selected position i of s[0, n), rank its place in ascending
// position order. Warp w walks positions [w·chunk, (w+1)·chunk) 32 at a time.
template <typename Emit>
__device__ void emit_selected(const float* s, int64_t n, Threshold th, Emit emit) {
  __shared__ long long warp_above[kSelectWarps], warp_equal[kSelectWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t chunk = (n + kSelectWarps - 1) / kSelectWarps;
  const int64_t begin = warp * chunk < n ? warp * chunk : n, end = begin + chunk < n ? begin + chunk : n;
  int64_t above = 0, equal = 0;
  for (int64_t i = begin + lane; i < end; i += 32) {
    const uint32_t key = order_key(s[i]);
    above += key > th.key;
    equal += key == th.key;
  }
  for (int o = 16; o > 0; o /= 2) {
    above += __shfl_xor_sync(0xFFFFFFFFu, above, o);
    equal += __shfl_xor_sync(0xFFFFFFFFu, equal, o);
  }
  if (lane == 0) warp_above[warp] = above, warp_equal[warp] = equal;
  __syncthreads();
  int64_t rank = 0, equal_seen = 0;
  for (int v = 0; v < warp; ++v) rank += warp_above[v], equal_seen += warp_equal[v];
  rank += equal_seen < th.take_equal ? equal_seen : th.take_equal;
  const uint32_t lower = (1u << lane) - 1;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t i = base + lane;
    const uint32_t key = i < end ? order_key(s[i]) : 0;
    const bool eq = i < end && key == th.key;
    const uint32_t eq_mask = __ballot_sync(0xFFFFFFFFu, eq);
    const bool take = (i < end && key > th.key) || (eq && equal_seen + __popc(eq_mask & lower) < th.take_equal);
    const uint32_t take_mask = __ballot_sync(0xFFFFFFFFu, take);
    if (take) emit(i, rank + __popc(take_mask & lower));
    rank += __popc(take_mask);
    equal_seen += __popc(eq_mask);
  }
}

__global__ void __launch_bounds__(kSelectThreads) top_kernel(const float* scores, int64_t n, int k, int32_t* positions) {
  const float* s = scores + blockIdx.x * n;
  int32_t* out = positions + int64_t(blockIdx.x) * k;
  const int64_t take = k < n ? k : n;
  for (int64_t i = take + threadIdx.x; i < k; i += kSelectThreads) out[i] = -1;
  if (take == 0) return;
  const Threshold th = select_threshold(s, n, take);
  emit_selected(s, n, th, [&](int64_t i, int64_t rank) { out[rank] = int32_t(i); });
}

// block_scores / chosen: scratch [rows, blocks].
__global__ void __launch_bounds__(kSelectThreads) candidate_kernel(const float* scores, int64_t n,
                                                                   const int64_t* compress_len, int topk_blocks,
                                                                   int block_size, float* block_scores, uint8_t* chosen,
                                                                   uint8_t* mask) {
  const int64_t r = blockIdx.x, blocks = (n + block_size - 1) / block_size;
  const float* s = scores + r * n;
  float* bs = block_scores + r * blocks;
  uint8_t* ch = chosen + r * blocks;
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
    emit_selected(bs, blocks, th, [&](int64_t b, int64_t) { ch[b] = 1; });
  }
  __syncthreads();
  for (int64_t t = threadIdx.x; t < n; t += kSelectThreads) {
    const int64_t b = t / block_size;
    mask[r * n + t] = ch[b] && bs[b] != -INFINITY;  // fewer reachable blocks than topk_blocks
  }
}

}  // namespace

void index_scores(const float* q, const float* w, int64_t rows, int heads, int hd, const uint8_t* keys, int64_t n,
                  const int64_t* visible, float* scores, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (heads <= 0 || heads > kMaxHeads) fail("cuda::index_scores", "1 to 64 heads", std::to_string(heads));
  if (reinterpret_cast<uintptr_t>(keys) % 4 != 0) fail("cuda::index_scores", "a 4-byte aligned key cache", "unaligned");
  const dim3 grid(unsigned((n + kKeysPerBlock - 1) / kKeysPerBlock), unsigned(rows));
  switch (hd) {
    case 32: score_kernel<32><<<grid, kKeysPerBlock, 0, stream>>>(q, w, heads, keys, n, visible, scores); break;
    case 64: score_kernel<64><<<grid, kKeysPerBlock, 0, stream>>>(q, w, heads, keys, n, visible, scores); break;
    case 128: score_kernel<128><<<grid, kKeysPerBlock, 0, stream>>>(q, w, heads, keys, n, visible, scores); break;
    default: fail("cuda::index_scores", "index head dim 32, 64 or 128", std::to_string(hd));
  }
  check_launch("cuda::index_scores");
}

void top_positions(const float* scores, int64_t rows, int64_t n, int k, int32_t* positions, cudaStream_t stream) {
  if (rows <= 0 || k <= 0) return;
  if (n >= (int64_t(1) << 31)) fail("cuda::top_positions", "fewer than 2^31 positions", std::to_string(n));
  top_kernel<<<unsigned(rows), kSelectThreads, 0, stream>>>(scores, n, k, positions);
  check_launch("cuda::top_positions");
}

void candidate_mask(const float* scores, int64_t rows, int64_t n, const int64_t* compress_len, int topk_blocks,
                    int block_size, uint8_t* mask, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return;
  if (block_size <= 0) fail("cuda::candidate_mask", "a positive block size", std::to_string(block_size));
  const int64_t blocks = (n + block_size - 1) / block_size;
  keep_scratch_pool();
  float* block_scores = nullptr;
  uint8_t* chosen = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&block_scores), size_t(rows * blocks) * sizeof(float), stream),
        "cuda::candidate_mask");
  check(cudaMallocAsync(reinterpret_cast<void**>(&chosen), size_t(rows * blocks), stream), "cuda::candidate_mask");
  candidate_kernel<<<unsigned(rows), kSelectThreads, 0, stream>>>(scores, n, compress_len, topk_blocks, block_size,
                                                                 block_scores, chosen, mask);
  check_launch("cuda::candidate_mask");
  check(cudaFreeAsync(block_scores, stream), "cuda::candidate_mask");
  check(cudaFreeAsync(chosen, stream), "cuda::candidate_mask");
}

}  // namespace dsv41::cuda
