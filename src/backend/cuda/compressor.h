#pragma once
// The compressor on the GPU: gated pooling (backend/cpu/compressor.h) over many groups at once, and
// the two cache encoders of what it produces (numerics/codecs.h): KV-FP4 for the main KV, MXFP4
// for the index keys. The norm between them is cuda::rms_norm, RoPE cuda::rope.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::cuda {

// out [groups, d] = dsv41::pool_group of each group's m rows of kv and score ([groups·m, d]),
// rounded to bf16 when `round` is set (the forward rounds the pooled latent before its norm).
void pool_groups(const float* kv, const float* score, int64_t groups, int m, int d, bool round, float* out,
                 cudaStream_t stream = nullptr);

// out [entries, kv_fp4::bytes(d)] = kv_fp4::encode of each row of x [entries, d]; bit-exact.
void kv_fp4_encode(const float* x, int64_t entries, int d, uint8_t* out, cudaStream_t stream = nullptr);

// out [entries, mxfp4::bytes(d)] = mxfp4::encode of each row of x [entries, d]; bit-exact.
void mxfp4_encode(const float* x, int64_t entries, int d, uint8_t* out, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
