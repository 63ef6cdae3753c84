#pragma once
// Mixture of experts on the GPU, as backend/cpu/moe.h: routing (gate logits, sqrt-softplus or
// sigmoid scores, top-k by score + bias, normalized weights) and the clamped SwiGLU expert over
// the checkpoint's fp4/fp8 weights read in place.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cpu/moe.h"

namespace dsv41::cuda {

// As dsv41::route (without `forced` and `biased`): experts [rows, k] best first, weights [rows, k].
// x [rows, dim] device; gate a device Weight (F32 or BF16, [experts, dim]); bias a device F32
// Weight [experts]; experts ≤ 4096, k ≤ 32.
void route(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
           int32_t* experts, float* weights, cudaStream_t stream = nullptr);

// The routing step alone, from the gate's fp32 logits [rows, n_experts] (what route() runs after
// cuda::linear_f32). bias: device [n_experts].
void route_from_logits(const float* logits, int64_t rows, int n_experts, const float* bias, const GateOptions& opt,
                       int32_t* experts, float* weights, cudaStream_t stream = nullptr);

// As dsv41::expert_ffn: y [rows, dim] = w2(bf16(weight · silu(min(w1 x, L)) · clamp(w3 x, -L, L))),
// the clamp when limit > 0, row_weights [rows] (device) when given. Device pointers and weights.
void expert_ffn(const float* x, int64_t rows, const Weight& w1, const Weight& w2, const Weight& w3, float limit,
                const float* row_weights, float* y, cudaStream_t stream = nullptr);

}  // namespace dsv41::cuda
