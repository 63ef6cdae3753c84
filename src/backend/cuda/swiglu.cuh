#pragma once
// The clamped SwiGLU of an expert's hidden value, as the CPU computes it: moe.cu's GEMV and
// elementwise kernels and the GEMM's act_quant of the hidden values (gemm.cu) share it.
#include "numerics/types.h"

namespace dsv41::cuda {

// The CPU expert's hidden value from the bf16 outputs g = w1 x, u = w3 x (forward.cpp through
// backend/cpu/moe.cpp, its expressions and order): bf16(weight · silu(min(g, L)) · clamp(u, -L, L)).
__device__ __forceinline__ float swiglu(float g, float u, float limit, const float* weight) {
  if (limit > 0) {
    u = u < -limit ? -limit : (limit < u ? limit : u);  // std::clamp
    g = limit < g ? limit : g;                         // std::min
  }
  float h = g / (1.0f + expf(-g)) * u;
  if (weight) h = *weight * h;
  return round_bf16(h);
}

}  // namespace dsv41::cuda
