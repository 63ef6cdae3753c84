#pragma once
// Helpers shared by the CPU op tests (tests/ops_*_test.cpp): seeded bf16 inputs, weights built in
// every checkpoint format over buffers the test owns, and the tolerance units the tests state.
//
// Expected values in those tests come from naive implementations written there (double precision
// where that makes the point) or from hand computation, never from the op under test.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "model/weight.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::test {

// fp32's unit roundoff: one rounding of an fp32 operation errs by at most u relative.
inline constexpr double kF32Unit = 0x1p-24;

// Normal(0, stddev) values rounded to bf16: the reference's activations are bf16 tensors.
inline std::vector<float> bf16_normal(size_t n, double stddev, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = round_bf16(float(normal(rng)));
  return x;
}

// Uniform values in [lo, hi) rounded to bf16.
inline std::vector<float> bf16_uniform(size_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uniform(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = round_bf16(float(uniform(rng)));
  return x;
}

// The spacing of bf16 numbers at |x| (one bf16 ulp): 2^(floor(log2|x|) - 7) for normal x, the
// subnormal spacing 2^-133 below 2^-126 (and for 0).
inline double bf16_ulp(double x) {
  x = std::fabs(x);
  if (!(x >= 0x1p-126)) return 0x1p-133;
  int e;
  std::frexp(x, &e);  // x = f * 2^e, f in [0.5, 1)
  return std::ldexp(1.0, e - 1 - 7);
}

// Each output within one bf16 ulp of the exact value, and at least 99% of them bf16(exact): for
// ops that compute in fp32 (a few 2^-24 relative per step, far below bf16's half ulp of 2^-9) and
// round once, so only an exact value within that error of a rounding midpoint may round the other
// way. `exact` holds the double-precision values of what the op rounds.
inline void expect_bf16_of(const std::vector<float>& got, const std::vector<double>& exact, const char* what) {
  ASSERT_EQ(got.size(), exact.size());
  size_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], exact[i], bf16_ulp(exact[i])) << what << " element " << i;
    ASSERT_EQ(got[i], round_bf16(got[i])) << what << " element " << i << " is not a bf16 value";
    same += got[i] == round_bf16(float(exact[i]));
  }
  EXPECT_GE(double(same), 0.99 * double(got.size())) << what;
}

// A weight matrix in one of the checkpoint formats over bytes this object owns; view() is the
// zero-copy Weight the ops read (valid while this object lives). `values` keeps what the format
// represents: the floats rounded to bf16, or the quantized matrix dequantized by the codecs.
struct OwnedWeight {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> data, scale;
  std::vector<float> values;  // [rows, cols], the exact values the weight stands for

  Weight view() const { return Weight{format, rows, cols, data.data(), scale.empty() ? nullptr : scale.data()}; }
  double at(int64_t r, int64_t c) const { return values[size_t(r * cols + c)]; }
};

inline OwnedWeight make_weight(WeightFormat format, const std::vector<float>& w, int rows, int cols) {
  OwnedWeight o;
  o.format = format;
  o.rows = rows;
  o.cols = cols;
  const size_t n = size_t(rows) * size_t(cols);
  o.values.resize(n);
  switch (format) {
    case WeightFormat::F32:
      o.data.resize(4 * n);
      std::memcpy(o.data.data(), w.data(), 4 * n);
      o.values.assign(w.begin(), w.begin() + ptrdiff_t(n));
      break;
    case WeightFormat::BF16:
      o.data.resize(2 * n);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t b = bf16_from_float(w[i]);
        o.data[2 * i] = uint8_t(b & 0xFF);  // safetensors is little-endian
        o.data[2 * i + 1] = uint8_t(b >> 8);
        o.values[i] = bf16_to_float(b);
      }
      break;
    case WeightFormat::FP8:
      o.data.resize(n);
      o.scale.resize(fp8_weight_scale_count(rows, cols));
      quantize_fp8_weight(w.data(), rows, cols, o.data.data(), o.scale.data());
      dequantize_fp8_weight(o.data.data(), o.scale.data(), rows, cols, o.values.data());
      break;
    case WeightFormat::FP4:
      o.data.resize(fp4_weight_bytes(rows, cols));
      o.scale.resize(fp4_weight_scale_count(rows, cols));
      quantize_fp4_weight(w.data(), rows, cols, o.data.data(), o.scale.data());
      dequantize_fp4_weight(o.data.data(), o.scale.data(), rows, cols, o.values.data());
      break;
  }
  return o;
}

// A Weight over the caller's own fp32 buffer (mHC's hand-set weights, norm weights, gate bias).
inline Weight f32_view(const std::vector<float>& v, int64_t rows, int64_t cols) {
  return Weight{WeightFormat::F32, rows, cols, reinterpret_cast<const uint8_t*>(v.data()), nullptr};
}

inline const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return "F32";
    case WeightFormat::BF16: return "BF16";
    case WeightFormat::FP8: return "FP8";
    case WeightFormat::FP4: return "FP4";
  }
  return "?";
}

// Random e2m1 values × 2^-3 (multiples of 1/16 up to 0.75): products and short sums of them are
// exact in fp32, so a naive reference rounds exactly as the op does.
inline std::vector<float> e2m1_eighths(size_t n, uint32_t seed) {
  static const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  std::mt19937 rng(seed);
  std::vector<float> x(n);
  for (float& v : x) {
    const uint32_t r = rng();
    v = (r & 8 ? -1.0f : 1.0f) * grid[r & 7] * 0.125f;
  }
  return x;
}

}  // namespace dsv41::test
