#pragma once
// Linear layers (model.py Linear, F.linear; Attention's grouped wo_a): y = x Wᵀ with W [N, K] as
// torch stores it, in T throughout (no activation quantization, no bf16 output rounding:
// docs/training.md, "Precision flow").
//
//   dx += dy W      dW += dyᵀ x
//
// In float (CPU training) the three products run on the engine's fp32 GEMM (backend/cpu/gemm.h),
// which multiplies x by a transposed W; the backward's two products give it transposed operands
// (dy W = dy (Wᵀ)ᵀ, dyᵀ x = (dyᵀ)(xᵀ)ᵀ), made in scratch copies. In double (the gradient checks)
// they are the plain loops.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend/cpu/gemm.h"

namespace dsv41::grad {

namespace linear_detail {

// Scratch that outlives the calls (a step makes hundreds of products; fresh buffers cost a fill and
// page faults each time): one per thread, grown as needed.
inline std::vector<float>& scratch(int which) {
  thread_local std::vector<float> buffers[3];
  return buffers[which];
}

// t [cols, rows] = aᵀ, a [rows, cols], in tiles that stay in cache.
inline const float* transpose(const float* a, int64_t rows, int64_t cols, int which) {
  constexpr int64_t kTile = 32;
  std::vector<float>& t = scratch(which);
  if (t.size() < size_t(rows * cols)) t.resize(size_t(rows * cols));
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) t[size_t(c * rows + r)] = a[r * cols + c];
  return t.data();
}

// y [M, N] += a [M, K] · bᵀ, b [N, K], through the GEMM.
inline void gemm_add(const float* a, int64_t M, const float* b, int64_t N, int64_t K, float* y) {
  std::vector<float>& product = scratch(2);
  if (product.size() < size_t(M * N)) product.resize(size_t(M * N));
  gemm_f32(a, M, b, N, K, product.data(), N);
  for (int64_t i = 0; i < M * N; ++i) y[i] += product[size_t(i)];
}

}  // namespace linear_detail

// y [M, N] = x [M, K] · Wᵀ, W [N, K].
template <class T>
void linear_forward(const T* x, int64_t M, int64_t K, const T* W, int64_t N, T* y) {
  if constexpr (std::is_same_v<T, float>) {
    gemm_f32(x, M, W, N, K, y, N);
  } else {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        T sum = 0;
        // In vector lanes (any order is as good for the checks, and the whole-model check runs
        // thousands of forwards).
#pragma omp simd reduction(+ : sum)
        for (int64_t k = 0; k < K; ++k) sum += x[m * K + k] * W[n * K + k];
        y[m * N + n] = sum;
      }
  }
}

// dx [M, K] += dy W; dW [N, K] += dyᵀ x. Either may be nullptr (not wanted).
template <class T>
void linear_backward(const T* x, int64_t M, int64_t K, const T* W, int64_t N, const T* dy, T* dx, T* dW) {
  if constexpr (std::is_same_v<T, float>) {
    if (dx) linear_detail::gemm_add(dy, M, linear_detail::transpose(W, N, K, 0), K, N, dx);
    if (dW) linear_detail::gemm_add(linear_detail::transpose(dy, M, N, 0), N, linear_detail::transpose(x, M, K, 1), K, M, dW);
  } else {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const T g = dy[m * N + n];
        if (dx)
          for (int64_t k = 0; k < K; ++k) dx[m * K + k] += g * W[n * K + k];
        if (dW)
          for (int64_t k = 0; k < K; ++k) dW[n * K + k] += g * x[m * K + k];
      }
  }
}

// The grouped low-rank output (Attention.forward's einsum "bsgd,grd->bsgr"): x [M, G, Kg] with
// group g through W's rows [g·Ng, (g+1)·Ng) (W [G·Ng, Kg]), y [M, G, Ng]: block-diagonal. Each
// group's columns are gathered into one [M, Kg] product.
template <class T>
void linear_grouped_forward(const T* x, int64_t M, int64_t G, int64_t Kg, const T* W, int64_t Ng, T* y) {
  std::vector<T> xg(size_t(M * Kg)), yg(size_t(M * Ng));
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t m = 0; m < M; ++m) std::copy_n(x + (m * G + g) * Kg, Kg, xg.data() + m * Kg);
    linear_forward(xg.data(), M, Kg, W + g * Ng * Kg, Ng, yg.data());
    for (int64_t m = 0; m < M; ++m) std::copy_n(yg.data() + m * Ng, Ng, y + (m * G + g) * Ng);
  }
}

template <class T>
void linear_grouped_backward(const T* x, int64_t M, int64_t G, int64_t Kg, const T* W, int64_t Ng, const T* dy, T* dx,
                             T* dW) {
  std::vector<T> xg(size_t(M * Kg)), dyg(size_t(M * Ng)), dxg;
  for (int64_t g = 0; g < G; ++g) {
    for (int64_t m = 0; m < M; ++m) {
      std::copy_n(x + (m * G + g) * Kg, Kg, xg.data() + m * Kg);
      std::copy_n(dy + (m * G + g) * Ng, Ng, dyg.data() + m * Ng);
    }
    if (dx) dxg.assign(size_t(M * Kg), T(0));
    linear_backward(xg.data(), M, Kg, W + g * Ng * Kg, Ng, dyg.data(), dx ? dxg.data() : nullptr, dW ? dW + g * Ng * Kg : nullptr);
    if (dx)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t k = 0; k < Kg; ++k) dx[(m * G + g) * Kg + k] += dxg[size_t(m * Kg + k)];
  }
}

}  // namespace dsv41::grad
