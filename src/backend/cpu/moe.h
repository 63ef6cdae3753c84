#pragma once
// Mixture of experts (model.py Gate, Expert): routing by sqrt-softplus scores with a selection-only
// bias, and the clamped SwiGLU expert.
#include <cstdint>
#include <string>

#include "model/gate.h"
#include "model/weight.h"

namespace dsv41 {

// For each row of x [rows, dim]: experts [rows, topk] (best biased score first) and their weights
// [rows, topk]: the unbiased scores, normalized over the chosen k, times route_scale. With
// `forced` [rows, topk], those experts are taken instead of the best, weighted the same way.
// `biased` [rows, experts], optional: the scores plus bias that selection ranks. With `bias_vl`
// and `image_rows` [rows] (nonzero: a row of an image span), those rows rank by the scores plus
// bias_vl instead (model.py Gate.forward's image_mask; docs/vision.md §8); the weights still come
// from the unbiased scores.
void route(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
           int32_t* experts, float* weights, float* biased = nullptr, const int32_t* forced = nullptr,
           const Weight* bias_vl = nullptr, const uint8_t* image_rows = nullptr);

// y [rows, dim] (bf16 values) = w2(bf16(weight · silu(min(w1 x, L)) · clamp(w3 x, -L, L))), the
// clamp only when limit > 0, the weight only when row_weights is given.
void expert_ffn(const float* x, int64_t rows, const Weight& w1, const Weight& w2, const Weight& w3, float limit,
                const float* row_weights, float* y);

}  // namespace dsv41
