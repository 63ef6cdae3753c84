#pragma once
// Linear layers (model.py Linear, F.linear; Attention's grouped wo_a): y = x Wᵀ with W [N, K] as
// torch stores it, in T throughout (no activation quantization, no bf16 output rounding:
// docs/training.md, "Precision flow").
//
//   dx += dy W      dW += dyᵀ x
#include <cstdint>

namespace dsv41::grad {

// y [M, N] = x [M, K] · Wᵀ, W [N, K].
template <class T>
void linear_forward(const T* x, int64_t M, int64_t K, const T* W, int64_t N, T* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      T sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += x[m * K + k] * W[n * K + k];
      y[m * N + n] = sum;
    }
}

// dx [M, K] += dy W; dW [N, K] += dyᵀ x. Either may be nullptr (not wanted).
template <class T>
void linear_backward(const T* x, int64_t M, int64_t K, const T* W, int64_t N, const T* dy, T* dx, T* dW) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      const T g = dy[m * N + n];
      if (dx)
        for (int64_t k = 0; k < K; ++k) dx[m * K + k] += g * W[n * K + k];
      if (dW)
        for (int64_t k = 0; k < K; ++k) dW[n * K + k] += g * x[m * K + k];
    }
}

// The grouped low-rank output (Attention.forward's einsum "bsgd,grd->bsgr"): x [M, G, Kg] with
// group g through W's rows [g·Ng, (g+1)·Ng) (W [G·Ng, Kg]), y [M, G, Ng]: block-diagonal.
template <class T>
void linear_grouped_forward(const T* x, int64_t M, int64_t G, int64_t Kg, const T* W, int64_t Ng, T* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) linear_forward(x + (m * G + g) * Kg, 1, Kg, W + g * Ng * Kg, Ng, y + (m * G + g) * Ng);
}

template <class T>
void linear_grouped_backward(const T* x, int64_t M, int64_t G, int64_t Kg, const T* W, int64_t Ng, const T* dy, T* dx,
                             T* dW) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g)
      linear_backward(x + (m * G + g) * Kg, 1, Kg, W + g * Ng * Kg, Ng, dy + (m * G + g) * Ng,
                      dx ? dx + (m * G + g) * Kg : nullptr, dW ? dW + g * Ng * Kg : nullptr);
}

}  // namespace dsv41::grad
