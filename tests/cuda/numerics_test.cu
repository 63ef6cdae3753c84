// The scalar conversions of src/numerics/types.h and the block scale rules of codecs.h run inside a
// CUDA kernel and must agree bit for bit with the same functions on the host: the CUDA backend
// quantizes with them, the CPU reference checks it with them.
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/dequant.cuh"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

// Everything computed from one float input and one byte code, as raw bits.
struct Conversions {
  uint32_t e4m3_value, e2m1_value, e8m0_value, bf16_value;  // decoders, on the code
  uint32_t e4m3_code, e2m1_code, bf16_code, e8m0_code;      // encoders, on the float
  uint32_t pow2, kv_fp4_scale, mxfp4_scale, swa_fp8_scale, fp8_weight_scale;
};

// A NaN that comes out of float arithmetic (a scale rule fed a NaN amax) carries a payload that
// differs between the CPU and the GPU; only its being NaN is part of the contract.
DSV41_HD uint32_t value_bits(float x) { return is_nan(x) ? 0x7FC00000u : float_bits(x); }

DSV41_HD Conversions convert(float x, uint8_t code) {
  const float magnitude = float_from_bits(float_bits(x) & 0x7FFFFFFFu);
  Conversions c;
  c.e4m3_value = float_bits(e4m3_to_float(code));
  c.e2m1_value = float_bits(e2m1_to_float(code));
  c.e8m0_value = float_bits(e8m0_to_float(code));
  c.bf16_value = float_bits(bf16_to_float(uint16_t(code << 8 | code)));
  c.e4m3_code = e4m3_from_float(x);
  c.e2m1_code = e2m1_from_float(x);
  c.bf16_code = bf16_from_float(x);
  c.e8m0_code = e8m0_from_pow2(pow2_ceil(magnitude));
  c.pow2 = float_bits(pow2_ceil(magnitude));
  c.kv_fp4_scale = value_bits(kv_fp4::block_scale(magnitude));
  c.mxfp4_scale = value_bits(mxfp4::block_scale(magnitude));
  c.swa_fp8_scale = value_bits(swa_fp8::block_scale(magnitude));
  c.fp8_weight_scale = value_bits(fp8_weight_block_scale(magnitude));
  return c;
}

__global__ void convert_all(const float* x, Conversions* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = convert(x[i], uint8_t(i));
}

// Every bf16 bit pattern, each with several different low halves (RNE ties, just above and below
// them), so every exponent, both signs, zeros, subnormals, infinities and NaNs are covered.
std::vector<float> inputs() {
  std::vector<float> xs;
  for (uint32_t high = 0; high < 0x10000; ++high)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu})
      xs.push_back(float_from_bits(high << 16 | low));
  return xs;
}

// kernel(x, out, n) over xs, one thread per input; empty on any CUDA error.
template <typename T>
std::vector<T> run_on_device(void (*kernel)(const float*, T*, int), const std::vector<float>& xs) {
  const int n = int(xs.size());
  float* x = nullptr;
  T* out = nullptr;
  std::vector<T> result(n);
  bool ok = cudaMalloc(&x, n * sizeof(float)) == cudaSuccess && cudaMalloc(&out, n * sizeof(T)) == cudaSuccess &&
            cudaMemcpy(x, xs.data(), n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess;
  if (ok) {
    kernel<<<(n + 255) / 256, 256>>>(x, out, n);
    ok = cudaGetLastError() == cudaSuccess &&
         cudaMemcpy(result.data(), out, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  cudaFree(x);
  cudaFree(out);
  if (!ok) result.clear();
  return result;
}

bool have_device() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

#define EXPECT_SAME_FIELD(field) EXPECT_EQ(device[i].field, host.field) << #field << " for input " << i

TEST(NumericsCuda, DeviceConversionsMatchTheHostBitForBit) {
  ASSERT_TRUE(have_device()) << "no CUDA device: GPU tests run only where one is present (scripts/test.sh)";
  const std::vector<float> xs = inputs();
  const int n = int(xs.size());
  const std::vector<Conversions> device = run_on_device(convert_all, xs);
  ASSERT_EQ(int(device.size()), n) << "CUDA error";

  // Stops at the first input that differs, after reporting each of its fields that differ.
  for (int i = 0; i < n && !HasFailure(); ++i) {
    const Conversions host = convert(xs[i], uint8_t(i));
    EXPECT_SAME_FIELD(e4m3_value);
    EXPECT_SAME_FIELD(e2m1_value);
    EXPECT_SAME_FIELD(e8m0_value);
    EXPECT_SAME_FIELD(bf16_value);
    EXPECT_SAME_FIELD(e4m3_code);
    EXPECT_SAME_FIELD(e2m1_code);
    EXPECT_SAME_FIELD(bf16_code);
    EXPECT_SAME_FIELD(e8m0_code);
    EXPECT_SAME_FIELD(pow2);
    EXPECT_SAME_FIELD(kv_fp4_scale);
    EXPECT_SAME_FIELD(mxfp4_scale);
    EXPECT_SAME_FIELD(swa_fp8_scale);
    EXPECT_SAME_FIELD(fp8_weight_scale);
  }
}

// NVIDIA's own conversions (satfinite e4m3, round-to-nearest e2m1 and bf16), packed into one word.
__global__ void convert_with_cuda(const float* x, uint32_t* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const __nv_bfloat16 bf16 = __float2bfloat16_rn(x[i]);
  out[i] = uint32_t(__nv_cvt_float_to_fp8(x[i], __NV_SATFINITE, __NV_E4M3)) |
           uint32_t(__nv_cvt_float_to_fp4(x[i], __NV_E2M1, cudaRoundNearest)) << 8 |
           uint32_t(__bfloat16_as_ushort(bf16)) << 16;
}

// Our encoders are NVIDIA's conversions, saturation and the sign of zero included. NaN is the one
// input where they part: cvt gives +6 for e2m1 (which has no NaN) and a canonical bf16 NaN, so
// NaN inputs are only checked for e4m3 (both give 0x7F).
TEST(NumericsCuda, EncodersMatchCudaConversions) {
  ASSERT_TRUE(have_device()) << "no CUDA device: GPU tests run only where one is present (scripts/test.sh)";
  const std::vector<float> xs = inputs();
  const std::vector<uint32_t> cuda = run_on_device(convert_with_cuda, xs);
  ASSERT_EQ(cuda.size(), xs.size()) << "CUDA error";
  for (std::size_t i = 0; i < xs.size() && !HasFailure(); ++i) {
    const float x = xs[i];
    EXPECT_EQ(cuda[i] & 0xFF, e4m3_from_float(x)) << "e4m3 of bits " << std::hex << float_bits(x);
    if (is_nan(x)) continue;
    EXPECT_EQ((cuda[i] >> 8) & 0xF, e2m1_from_float(x)) << "e2m1 of bits " << std::hex << float_bits(x);
    EXPECT_EQ(cuda[i] >> 16, bf16_from_float(x)) << "bf16 of bits " << std::hex << float_bits(x);
  }
}

// The GEMV's activation quantization rounds with the hardware (cuda::e4m3_round2); it must equal
// the CPU's integer encoder followed by its decoder on every fp32 value, so every one of the 2^32
// bit patterns is checked (NaNs excepted: both give a NaN, which no activation holds). Pairs of
// A magnitude goes through the call in the low lane and its negation in the high one.
__global__ void count_round_mismatches(unsigned long long* mismatches, uint32_t* first) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  unsigned long long local = 0;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t(1) << 31); i += stride) {
    const uint32_t bits[2] = {uint32_t(i), uint32_t(i) | 0x80000000u};
    const float2 got = cuda::e4m3_round2(float_from_bits(bits[0]), float_from_bits(bits[1]));
    const float g[2] = {got.x, got.y};
    for (int k = 0; k < 2; ++k) {
      const float x = float_from_bits(bits[k]);
      if (is_nan(x)) continue;
      if (float_bits(g[k]) != float_bits(e4m3_to_float(e4m3_from_float(x)))) {
        ++local;
        atomicCAS(first, 0xFFFFFFFFu, bits[k]);
      }
    }
  }
  if (local) atomicAdd(mismatches, local);
}

TEST(NumericsCuda, HardwareE4m3RoundingMatchesTheEncoderOnEveryFloat) {
  ASSERT_TRUE(have_device()) << "no CUDA device: GPU tests run only where one is present (scripts/test.sh)";
  unsigned long long* mismatches = nullptr;
  uint32_t* first = nullptr;
  ASSERT_EQ(cudaMalloc(&mismatches, sizeof *mismatches), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&first, sizeof *first), cudaSuccess);
  ASSERT_EQ(cudaMemset(mismatches, 0, sizeof *mismatches), cudaSuccess);
  ASSERT_EQ(cudaMemset(first, 0xFF, sizeof *first), cudaSuccess);
  count_round_mismatches<<<4096, 256>>>(mismatches, first);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  unsigned long long count = 0;
  uint32_t first_bits = 0;
  ASSERT_EQ(cudaMemcpy(&count, mismatches, sizeof count, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&first_bits, first, sizeof first_bits, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(mismatches), cudaFree(first);
  EXPECT_EQ(count, 0u) << "first differing input bits " << std::hex << first_bits;
}

}  // namespace
}  // namespace dsv41
