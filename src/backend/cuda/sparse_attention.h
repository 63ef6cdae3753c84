#pragma once
// Sparse attention decode with a sink on the GPU, as dsv41::sparse_attention
// (backend/cpu/sparse_attention.h), reading the caches in their stored formats: the sliding
// window from the SWA-FP8 ring and the selected compressed entries from the KV-FP4 cache.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::cuda {

// Which kernels compute a call. head_groups and split_tiles are bit-identical; tensor_cores differs
// from them in the order and rounding of fp32 sums only, and warpgroups from tensor_cores. `automatic` picks by the size of the
// batch and the shape (sparse_attention.cu says how); the op test names each to compare them.
enum class SparseAttentionPath {
  automatic,
  head_groups,  // one block per (token, group of heads) walks the token's tiles in sequence
  split_tiles,  // three kernels, parallel over the tiles (small batches)
  tensor_cores,  // one block per (token, 32 heads), S and P·V as bf16 mma (D = 512, heads not a multiple of 64)
  warpgroups,    // one block per (token, 64 heads), wgmma with the decode beside it (8 tokens and more; D = 512)
  split_tensor_cores,  // split over the tiles with tensor_cores' products, 32 heads a block (small batches; D = 512)
};

struct SparseAttentionBatch {
  int64_t tokens = 0;  // B query positions, each of its own sequence
  int heads = 0, dim = 0;  // H query heads of `dim` (64 or 512) sharing one K=V entry
  // Token b attends to the W window entries rings[b] + window[b·W + j]·swa_fp8::bytes(dim), then
  // the K compressed entries caches[b] + topk[b·K + j]·kv_fp4::bytes(dim), in that order (the
  // order the CPU op's `entries` list has); an index of -1 is an empty slot.
  const uint8_t* const* rings = nullptr;  // [B] device pointers, in device memory
  const int32_t* window = nullptr;        // [B, W]
  int W = 0;
  const uint8_t* const* caches = nullptr;  // [B] device pointers, in device memory (unread, may be null, if K = 0)
  const int32_t* topk = nullptr;           // [B, K]
  int K = 0;
  SparseAttentionPath path = SparseAttentionPath::automatic;
};

// out [B, H, dim] (bf16 values) from q [B, H, dim] (bf16 values), sink [H], scale. Device pointers.
void sparse_attention(const SparseAttentionBatch& batch, const float* q, const float* sink, float scale, float* out,
                      cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
