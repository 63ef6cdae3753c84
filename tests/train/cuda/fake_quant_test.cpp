// The device's fake quantization (src/train/cuda/fake_quant.h) against numerics/codecs.h's
// quantize_dequantize, bit for bit, for each codec: random values over six decades, all-zero
// blocks (the scales' floors), values past the formats' ranges (saturation), subnormal scales,
// signed zeros, in place and not; bad lengths refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "numerics/codecs.h"
#include "train/cuda/fake_quant.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaFakeQuant, EachCodecIsTheCpusBitForBit) {
  DSV41_REQUIRE_DEVICE();
  struct Codec {
    train_cuda::FakeQuant device;
    void (*cpu)(float*, int);
    int d;  // a vector's length as the trainer quantizes it
    const char* name;
  };
  const Codec codecs[] = {{train_cuda::FakeQuant::KvFp4, kv_fp4::quantize_dequantize, 512, "kv_fp4"},
                          {train_cuda::FakeQuant::Mxfp4, mxfp4::quantize_dequantize, 128, "mxfp4"},
                          {train_cuda::FakeQuant::SwaFp8, swa_fp8::quantize_dequantize, 512, "swa_fp8"}};
  for (const Codec& k : codecs) {
    const int vectors = 300;
    std::vector<float> x(size_t(vectors * k.d));
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> exponent(-6, 6), unit(-1, 1);
    for (size_t i = 0; i < x.size(); ++i) {
      const int v = int(i / size_t(k.d));  // each vector its own scale of values
      x[i] = unit(rng) * std::pow(10.0f, v % 13 == 0 ? exponent(rng) : float(v % 7) - 3);
    }
    std::fill_n(x.begin(), 64, 0.0f);              // all-zero blocks: the scale's floor
    for (int i = 64; i < 96; ++i) x[size_t(i)] = (i % 2 ? -1.0f : 1.0f) * 1e6f;  // past every range
    for (int i = 96; i < 128; ++i) x[size_t(i)] = float(i - 96) * 1e-40f;        // subnormal inputs
    x[130] = -0.0f;

    std::vector<float> want = x;
    for (int v = 0; v < vectors; ++v) k.cpu(want.data() + size_t(v) * size_t(k.d), k.d);

    DeviceArray<float> in(x), out(x.size());
    out.poison();
    train_cuda::fake_quantize(k.device, in.get(), int64_t(x.size()), out.get());
    const std::vector<float> got = out.download();
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i) differ += std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << k.name;
    train_cuda::fake_quantize(k.device, in.get(), int64_t(x.size()), in.get());  // in place
    EXPECT_TRUE(test::same_bits(in.download(), want)) << k.name << " in place";
    EXPECT_FALSE(test::same_bits(got, x)) << k.name << ": the values moved";
  }
  DeviceArray<float> small(std::vector<float>(40, 1.0f));
  EXPECT_THROW(train_cuda::fake_quantize(train_cuda::FakeQuant::KvFp4, small.get(), 40, small.get()), Error);
  EXPECT_THROW(train_cuda::fake_quantize(train_cuda::FakeQuant::SwaFp8, small.get(), 16, small.get()), Error);
}

}  // namespace
}  // namespace dsv41
