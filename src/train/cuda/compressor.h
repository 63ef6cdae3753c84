#pragma once
// CSA2's compressor pooling of the CUDA trainer, the mirror of src/train/grad/compressor.h (fp32):
// the rows' KV projections pooled `ratio` at a time into one latent, channel by channel, weighted by
// a softmax over the group of the gate projections' scores:
//
//   out_c = Σ_t p_tc kv_tc,  p_tc = exp(score_tc − max_t score_tc) / Σ_t' exp(score_t'c − max)
//   dkv_tc += p_tc dout_c,  dscore_tc += p_tc dout_c (kv_tc − out_c)
//
// The projections before it and the RMSNorm after it are linear.h's and norm.h's.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// kv, score [rows, d]; out [rows / ratio, d] (written), one latent per complete group: the rows of
// an open group at the end give none (and get no gradient). Device pointers.
void compressor_pool_forward(const float* kv, const float* score, int64_t rows, int64_t d, int ratio, float* out,
                             cudaStream_t stream = nullptr);

// out: the forward's output. Adds into dkv and dscore [rows, d].
void compressor_pool_backward(const float* kv, const float* score, int64_t rows, int64_t d, int ratio, const float* out,
                              const float* dout, float* dkv, float* dscore, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
