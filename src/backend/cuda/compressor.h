#pragma once
// The compressor on the GPU: gated pooling (backend/cpu/compressor.h) over many groups at once, and
// the cache encoders (numerics/codecs.h): KV-FP4 for the main KV and MXFP4 for the index keys that
// the compressor produces, SWA-FP8 for the sliding window. The norm between them is cuda::rms_norm,
// RoPE cuda::rope.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::cuda {

// out [groups, d] = dsv41::pool_group of each group's m rows of kv and score ([groups·m, d]),
// rounded to bf16 when `round` is set (the forward rounds the pooled latent before its norm).
void pool_groups(const float* kv, const float* score, int64_t groups, int m, int d, bool round, float* out,
                 cudaStream_t stream = nullptr);

// A decode step of `sequences` sequences, each with an open group of open_rows[b] < m rows
// (open_kv[b], open_score[b]: device arrays of m rows of d): appends row b of kv and score
// [sequences, d] to sequence b's open group, and where that completes the group (open_rows[b] + 1
// == m), out[b] = pool_groups of it; else out[b] = 0. All arrays are device memory, so a captured
// step replays with new counts.
void append_pool(const float* kv, const float* score, int64_t sequences, float* const* open_kv, float* const* open_score,
                 const int32_t* open_rows, int m, int d, bool round, float* out, cudaStream_t stream = nullptr);

// out [entries, kv_fp4::bytes(d)] = kv_fp4::encode of each row of x [entries, d]; bit-exact.
void kv_fp4_encode(const float* x, int64_t entries, int d, uint8_t* out, cudaStream_t stream = nullptr);
// The same with entry e to out[e] (a device array of device pointers), none where out[e] is null.
void kv_fp4_encode(const float* x, int64_t entries, int d, uint8_t* const* out, cudaStream_t stream = nullptr);

// out [entries, mxfp4::bytes(d)] = mxfp4::encode of each row of x [entries, d]; bit-exact.
void mxfp4_encode(const float* x, int64_t entries, int d, uint8_t* out, cudaStream_t stream = nullptr);
// The same with entry e to out[e] (a device array of device pointers), none where out[e] is null.
void mxfp4_encode(const float* x, int64_t entries, int d, uint8_t* const* out, cudaStream_t stream = nullptr);

// swa_fp8::encode of each row of x [entries, d] into out[e] (device array of `entries` device
// pointers, one swa_fp8::bytes(d) entry each: ring slots or window-buffer rows); bit-exact.
void swa_fp8_encode(const float* x, int64_t entries, int d, uint8_t* const* out, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
