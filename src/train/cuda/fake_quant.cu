// Fake quantization (fake_quant.h): one thread per block of 16 or 32 values, which it reads twice
// (the amax, then each element) and writes once; 8 bytes of traffic a value.
#include "train/cuda/fake_quant.h"

#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 256;

template <FakeQuant Codec>
struct Format;

template <>
struct Format<FakeQuant::KvFp4> {
  static constexpr int kBlock = kv_fp4::kBlock;
  __device__ static float scale(float amax) { return kv_fp4::block_scale(amax); }
  __device__ static float round(float v) { return e2m1_to_float(e2m1_from_float(v)); }
};

template <>
struct Format<FakeQuant::Mxfp4> {
  static constexpr int kBlock = mxfp4::kBlock;
  __device__ static float scale(float amax) { return mxfp4::block_scale(amax); }
  __device__ static float round(float v) { return e2m1_to_float(e2m1_from_float(v)); }
};

template <>
struct Format<FakeQuant::SwaFp8> {
  static constexpr int kBlock = swa_fp8::kBlock;
  __device__ static float scale(float amax) { return swa_fp8::block_scale(amax); }
  __device__ static float round(float v) { return e4m3_to_float(e4m3_from_float(v)); }
};

template <FakeQuant Codec>
__global__ void fake_quantize_kernel(const float* x, int64_t blocks, float* y) {
  using F = Format<Codec>;
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  const float* in = x + b * F::kBlock;
  float amax = 0.0f;
  for (int i = 0; i < F::kBlock; ++i) amax = fmaxf(amax, fabsf(in[i]));
  const float scale = F::scale(amax);
  float* out = y + b * F::kBlock;
  for (int i = 0; i < F::kBlock; ++i) out[i] = F::round(in[i] / scale) * scale;
}

template <FakeQuant Codec>
void launch(const float* x, int64_t n, float* y, cudaStream_t stream) {
  constexpr int block = Format<Codec>::kBlock;
  if (n < 0 || n % block != 0)
    fail("train_cuda::fake_quantize", "a length that is a multiple of " + std::to_string(block), std::to_string(n));
  const int64_t blocks = n / block;
  if (blocks == 0) return;
  fake_quantize_kernel<Codec><<<unsigned((blocks + kThreads - 1) / kThreads), kThreads, 0, stream>>>(x, blocks, y);
  cuda::check_launch("train_cuda::fake_quantize");
}

}  // namespace

void fake_quantize(FakeQuant codec, const float* x, int64_t n, float* y, cudaStream_t stream) {
  switch (codec) {
    case FakeQuant::KvFp4: return launch<FakeQuant::KvFp4>(x, n, y, stream);
    case FakeQuant::Mxfp4: return launch<FakeQuant::Mxfp4>(x, n, y, stream);
    case FakeQuant::SwaFp8: return launch<FakeQuant::SwaFp8>(x, n, y, stream);
  }
}

}  // namespace dsv41::train_cuda
