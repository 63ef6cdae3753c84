#pragma once
// Helpers of the CUDA trainer's op tests (tests/train/cuda): fp32 random inputs, their bf16 bits,
// bit-for-bit comparison, a batch's row ranges; the device arrays, NMSE and the GPU check are tests/cuda's.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "../../cuda/device_util.h"
#include "numerics/types.h"

namespace dsv41::test {

// bf16's unit roundoff: one round-to-nearest cast errs by at most this, relative.
inline constexpr double kBf16Unit = 0x1p-8;

// Normal(mean, stddev) fp32 values (not rounded to bf16: the trainer's fp32 tensors).
inline std::vector<float> normal(size_t n, double stddev, uint32_t seed, double mean = 0.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = float(dist(rng));
  return x;
}

// The values rounded to bf16 (each exactly representable afterwards).
inline std::vector<float> rounded_bf16(std::vector<float> x) {
  for (float& v : x) v = round_bf16(v);
  return x;
}

// The bf16 bits of each value, rounded to nearest even (the host's cast, numerics/types.h).
inline std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = bf16_from_float(x[i]);
  return b;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Each sequence's first row and the rows' end, from the sequences' row counts: the `begin` of a
// loss batched over sequences.
inline std::vector<int64_t> row_begins(const std::vector<int64_t>& rows) {
  std::vector<int64_t> begin(1, 0);
  for (int64_t n : rows) begin.push_back(begin.back() + n);
  return begin;
}

}  // namespace dsv41::test
