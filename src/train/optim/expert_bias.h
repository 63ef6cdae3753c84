#pragma once
// Auxiliary-loss-free load balancing (Wang et al. 2024, components.md §8; report §2.1.1: the gate's
// bias steers only the choice of experts, never the weights, and gets no gradient). After each
// step, with cᵢ the number of the step's tokens routed to expert i (each token counts once per
// expert it chose):
//
//   bᵢ ← bᵢ + u · sign(c̄ − cᵢ)
//
// so an overloaded expert's bias falls and an underloaded one's rises; an expert at the mean
// keeps its bias. u = 1e-3: the report's copy gives no rate (its text ends before one), DeepSeek-V3
// used 1e-3 (docs/training.md). Image tokens would update gate.bias_vl from their own loads the
// same way (report §2.1.1); the text models have none.
#include <cstdint>
#include <vector>

namespace dsv41::optim {

inline constexpr float kExpertBiasRate = 1e-3f;

// The loads of a step from the gate's choices (moe_gate.h GateSaved::experts, [rows, topk]; each
// in [0, n_experts)).
std::vector<int64_t> expert_loads(const int32_t* experts, int64_t rows, int topk, int64_t n_experts);

// bias [n_experts] ← bias + rate · sign(mean(loads) − loads).
void update_expert_bias(float* bias, const int64_t* loads, int64_t n_experts, float rate);

}  // namespace dsv41::optim
