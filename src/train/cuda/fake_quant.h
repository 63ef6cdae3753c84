#pragma once
// Quantization-aware training's fake quantization on the device (docs/training.md, "Where
// quantization-aware training plugs in"): the serving caches' codecs (numerics/codecs.h) applied
// as quantize → dequantize, the mirror of the CPU trainer's fake_quantize. Bit for bit the CPU
// codec's quantize_dequantize: the same host-device scale and element functions, a block's amax
// (a max: no order), the true division x / scale. The gradient passes unchanged (straight-through:
// elementwise.h's add_into is the backward).
//
//   KV-FP4   e2m1 elements, an e4m3 scale per 16   (the compressed main KV, after its RoPE)
//   MXFP4    e2m1 elements, a ue8m0 scale per 32   (the indexer's q and keys, after their RoPE)
//   SWA-FP8  e4m3 elements, a ue8m0 scale per 32   (the window KV, after its RoPE)
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

enum class FakeQuant { KvFp4, Mxfp4, SwaFp8 };

// y [n] = Q(x [n]) block by block; n a multiple of the codec's block (a vector of d values, d a
// multiple of it, is blocks of the flat array), else dsv41::Error. y may be x.
void fake_quantize(FakeQuant codec, const float* x, int64_t n, float* y, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
