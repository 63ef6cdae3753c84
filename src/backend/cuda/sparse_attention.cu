// Sparse attention decode over the SWA-FP8 ring and the KV-FP4 cache.
//
// One block per (token, group of G heads). The block walks the token's entry list (W window
// entries, then K selected compressed ones) in tiles of 64 entries, the CPU op's softmax block:
// it decodes each tile once from its stored format into shared memory as bf16 (exact: an e4m3 or
// e2m1 value times its scale has at most 8 significant bits), then scores the G heads against it,
// updates each head's running maximum and denominator, and accumulates the bf16-rounded
// probabilities times the entries into registers, in entry order. The online softmax is the
// CPU's step for step (same tiles, same running maximum, same bf16 rounding of p), so the
// results differ only by the order of the fp32 sums in the dot products and denominators and by
// expf's last bit.
//
// Traffic per token: (W·528 + K·288) bytes for dim 512 from memory (once; the H/G blocks of a
// token re-read it from L2), 2·H·dim·4 for q and out. V4.1 decode: 128·528 + 512·288 = 215 KB.
// Work per token: 2·H·(W + K)·dim multiply-adds (42 M for V4.1), plus the decode of the tile by
// each of the H/G blocks.
#include "backend/cuda/sparse_attention.h"

#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 64;  // entries per softmax block, as the CPU op (and the reference kernel)

template <int D, int G>
struct Smem {
  alignas(16) uint16_t tile[kTile][D];  // bf16 bits of the decoded entries; zeros for empty slots
  float q[G][D];
  float s[G][kTile];        // scores, then bf16-rounded probabilities
  float rescale[G], running_max[G], sum_exp[G];
  bool valid[kTile];
};

// A warp decodes one entry into `row` as bf16 bits; each lane takes 4 (SWA-FP8) or 8 (KV-FP4)
// consecutive channels per step, so the warp's loads are contiguous and its shared-memory stores
// (8 or 16 bytes a lane, consecutive) are free of bank conflicts.
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  return (float_bits(lo) >> 16) | (float_bits(hi) & 0xFFFF0000u);  // exact: the values are bf16
}

template <int D>
__device__ void decode_swa_fp8(const uint8_t* entry, int lane, uint16_t* row) {
  for (int c = 4 * lane; c < D; c += 128) {
    uint32_t word;
    if constexpr (swa_fp8::bytes(D) % 4 == 0) word = *reinterpret_cast<const uint32_t*>(entry + c);
    else word = entry[c] | entry[c + 1] << 8 | entry[c + 2] << 16 | uint32_t(entry[c + 3]) << 24;
    const float scale = e8m0_to_float(entry[swa_fp8::scales_offset(D) + c / swa_fp8::kBlock]) * kE4m3Unscale;
    float v[4];
    e4m3x4(word, v);
    *reinterpret_cast<uint2*>(row + c) = make_uint2(bf16_pair(v[0] * scale, v[1] * scale), bf16_pair(v[2] * scale, v[3] * scale));
  }
}

template <int D>
__device__ void decode_kv_fp4(const uint8_t* entry, int lane, uint16_t* row) {
  static_assert(kv_fp4::bytes(D) % 4 == 0, "4-byte aligned entries");
  for (int c = 8 * lane; c < D; c += 256) {
    const uint32_t word = *reinterpret_cast<const uint32_t*>(entry + c / 2);
    const float scale = e4m3_to_float(entry[kv_fp4::scales_offset(D) + c / kv_fp4::kBlock]) * kE2m1Unscale;
    float v[8];
    e2m1x8(word, v);
    *reinterpret_cast<uint4*>(row + c) = make_uint4(bf16_pair(v[0] * scale, v[1] * scale), bf16_pair(v[2] * scale, v[3] * scale),
                                                    bf16_pair(v[4] * scale, v[5] * scale), bf16_pair(v[6] * scale, v[7] * scale));
  }
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads) attention_kernel(SparseAttentionBatch batch, const float* q,
                                                             const float* sink, float scale, float* out) {
  static_assert(D % 64 == 0 && D / 2 <= kThreads, "a thread owns one channel pair");
  extern __shared__ __align__(16) unsigned char smem_bytes[];
  Smem<D, G>& sm = *reinterpret_cast<Smem<D, G>*>(smem_bytes);
  const int64_t b = blockIdx.x;
  const int h0 = blockIdx.y * G;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int H = batch.heads, W = batch.W, K = batch.K, E = W + K;

  for (int i = threadIdx.x; i < G * D; i += kThreads) sm.q[i / D][i % D] = q[(b * H + h0 + i / D) * D + i % D];
  if (threadIdx.x < G) sm.running_max[threadIdx.x] = -1e30f, sm.sum_exp[threadIdx.x] = 0;  // as the CPU op
  float acc[G][2];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = 0;
  const uint8_t* ring = batch.rings[b];
  const uint8_t* cache = K > 0 ? batch.caches[b] : nullptr;  // no cache list at all where K = 0
  const int pair = threadIdx.x;  // channels 2·pair, 2·pair + 1

  for (int e0 = 0; e0 < E; e0 += kTile) {
    const int n = E - e0 < kTile ? E - e0 : kTile;
    // 1. Decode the tile: warp w takes entries w, w + 8, ...
    for (int j = warp; j < n; j += kWarps) {
      const int e = e0 + j;
      const int32_t index = e < W ? batch.window[b * W + e] : batch.topk[b * K + (e - W)];
      uint16_t* row = sm.tile[j];
      if (index < 0) {
        for (int c = lane; c < D; c += 32) row[c] = 0;
      } else if (e < W) {
        decode_swa_fp8<D>(ring + int64_t(index) * swa_fp8::bytes(D), lane, row);
      } else {
        decode_kv_fp4<D>(cache + int64_t(index) * kv_fp4::bytes(D), lane, row);
      }
      if (lane == 0) sm.valid[j] = index >= 0;
    }
    __syncthreads();
    // 2. Scores: warp w takes entries w, w + 8, ...; each lane holds channels lane + 32k of the
    // entry in registers (conflict-free reads) and dots them with every head's.
    for (int j = warp; j < n; j += kWarps) {
      constexpr int C = D / 32;
      float v[C];
#pragma unroll
      for (int k = 0; k < C; ++k) v[k] = bf16_to_float(sm.tile[j][lane + 32 * k]);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0;
#pragma unroll
        for (int k = 0; k < C; ++k) dot = fmaf(sm.q[g][lane + 32 * k], v[k], dot);
        for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xFFFFFFFFu, dot, o);
        if (lane == 0) sm.s[g][j] = sm.valid[j] ? dot * scale : -INFINITY;
      }
    }
    __syncthreads();
    // 3. Online softmax, one warp per head: the CPU op's block step.
    for (int g = warp; g < G; g += kWarps) {
      const float s0 = lane < n ? sm.s[g][lane] : -INFINITY, s1 = lane + 32 < n ? sm.s[g][lane + 32] : -INFINITY;
      float block_max = fmaxf(s0, s1);
      for (int o = 16; o > 0; o /= 2) block_max = fmaxf(block_max, __shfl_xor_sync(0xFFFFFFFFu, block_max, o));
      const float previous = sm.running_max[g];
      const float running = fmaxf(previous, block_max);
      const float p0 = expf(s0 - running), p1 = expf(s1 - running);
      float block_sum = p0 + p1;
      for (int o = 16; o > 0; o /= 2) block_sum += __shfl_xor_sync(0xFFFFFFFFu, block_sum, o);
      __syncwarp();
      if (lane < n) sm.s[g][lane] = round_bf16(p0);  // the kernel casts p to bf16 before P·V
      if (lane + 32 < n) sm.s[g][lane + 32] = round_bf16(p1);
      if (lane == 0) {
        const float rescale = expf(previous - running);
        sm.rescale[g] = rescale;
        sm.running_max[g] = running;
        sm.sum_exp[g] = sm.sum_exp[g] * rescale + block_sum;
      }
    }
    __syncthreads();
    // 4. P·V in entry order; thread `pair` owns two channels of every head.
    if (2 * pair < D) {
      float block[G][2];
#pragma unroll
      for (int g = 0; g < G; ++g) block[g][0] = block[g][1] = 0;
      for (int j = 0; j < n; ++j) {
        uint32_t v2;
        memcpy(&v2, &sm.tile[j][2 * pair], 4);
        const float v0 = __uint_as_float(v2 << 16), v1 = __uint_as_float(v2 & 0xFFFF0000u);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          const float p = sm.s[g][j];
          block[g][0] += p * v0;
          block[g][1] += p * v1;
        }
      }
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

template <int D>
void launch_dim(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                cudaStream_t stream) {
  // Heads per block: as many as keep at least two blocks per multiprocessor (132 on the H200);
  // more heads per block decode each tile fewer times.
  const int64_t blocks_wanted = 2 * 132;
  int G = 1;
  for (int g : {8, 4, 2})
    if (batch.heads % g == 0 && batch.tokens * (batch.heads / g) >= blocks_wanted) {
      G = g;
      break;
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
