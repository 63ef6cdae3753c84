#pragma once
// The MoE gate of the CUDA trainer after its product (the logits W_g x are linear.h's), the mirror
// of src/train/grad/moe_gate.h: scores s_e = f(logit_e / temp), f = sqrt(softplus) (softplus the
// identity above 20) or the sigmoid; the top-k experts by s_e + bias_e (ties to the lower index,
// best first); weights w_j = s_{e_j} / (Σ_l s_{e_l} + 1e-20) · route_scale (without the division
// when not normalized). The choice and the bias have no gradient; with S the normalizer,
//
//   ds_{e_j} = route_scale · (dw_j / S − Σ_l dw_l s_{e_l} / S²)   (route_scale · dw_j unnormalized)
//   dlogit_e = ds_e · f'(logit_e / temp) / temp,  f' = σ(z) / (2 sqrt(softplus z)) or s (1 − s)
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// model/gate.h's GateOptions as the kernels take them.
struct GateParams {
  int topk = 6;
  bool sigmoid_scores = false;  // score_func "sigmoid" (else "sqrtsoftplus")
  bool normalized = true;       // norm_topk_prob and topk > 1
  float temp = 1.0f;
  float route_scale = 1.0f;
};

// logits, scores [rows, n_experts]; bias [n_experts]; experts, weights [rows, topk]. Writes scores,
// experts (best biased score first) and weights. forced [rows, topk] or nullptr: those experts are
// taken instead, in that order, weighted the same way (a held choice; one outside [0, n_experts)
// gets a NaN weight). Device pointers.
void gate_forward(const float* logits, int64_t rows, int64_t n_experts, const float* bias, const GateParams& p,
                  const int32_t* forced, float* scores, int32_t* experts, float* weights, cudaStream_t stream = nullptr);

// dweights [rows, topk] → dlogits [rows, n_experts] (written: the chosen experts' entries, 0
// elsewhere); the product's backward (linear.h) takes it to dx and dW_g.
void gate_backward(const float* logits, const float* scores, int64_t rows, int64_t n_experts, const int32_t* experts,
                   const float* dweights, const GateParams& p, float* dlogits, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
