#pragma once
// Scalar functions the backward of several ops shares, for any floating-point T (double for the
// gradient checks, float for training).
#include <cmath>

namespace dsv41::grad {

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace dsv41::grad
