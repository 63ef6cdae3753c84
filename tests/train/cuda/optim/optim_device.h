#pragma once
// Helpers of the CUDA optimizers' tests (tests/train/cuda/optim): the op tests' device arrays,
// random inputs and NMSE (train_device.h), and the measures the optimizers' bounds are stated in.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../train_device.h"

namespace dsv41::test {

// NMSE of a movement: Σ((got − start) − (want − start))² / Σ(want − start)², in double: how far
// the device's change of a tensor is from the CPU's, relative to the CPU's change.
inline double movement_nmse(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& start) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < start.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double g = double(got[i]) - start[i], w = double(want[i]) - start[i];
    err += (g - w) * (g - w);
    ref += w * w;
  }
  return ref > 0 ? err / ref : err;
}

inline double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, double(std::fabs(v)));
  return m;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as the maximum
  }
  return m;
}

// The fraction of elements whose bits differ.
inline double fraction_differing(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return a.empty() ? 0 : double(n) / double(a.size());
}

}  // namespace dsv41::test
