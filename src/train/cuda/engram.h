#pragma once
// Engram's gate of the CUDA trainer, the mirror of src/train/grad/engram.h (fp32; the lookup before
// it is embedding.h's gather and linear.h's wkv). Per token and stream m, with key_m and value from
// kv and w_m = q_weight_m ⊙ k_weight_m:
//
//   A = Σ_i h_i w_i key_i,  rh = (mean h² + eps)^-½,  rk = (mean key² + eps)^-½
//   dot = A · rh · rk / √d;  root = sign(dot) · sqrt(max(|dot|, 1e-6));  g = σ(root)
//   h' = h + g · value
//
// and the backward of grad/engram.h's header (below the clamp the root passes no gradient).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// What the backward reads: device arrays [rows, hc] each, the caller's.
struct EngramGateSaved {
  float *A, *rh, *rk, *dot, *gate;
};

// X, out [rows, hc, d] (out must not be X); kv [rows, (hc + 1) d]; q_weight, k_weight [hc, d].
void engram_gate_forward(const float* X, const float* kv, const float* q_weight, const float* k_weight, int64_t rows, int hc,
                         int64_t d, float eps, float* out, const EngramGateSaved& saved, cudaStream_t stream = nullptr);

// Adds into dX [rows, hc, d], dkv [rows, (hc + 1) d], dq_weight and dk_weight [hc, d]. The weights'
// sums over the rows are deterministic: 64-row chunks' partials added in chunk order.
void engram_gate_backward(const float* X, const float* kv, const float* q_weight, const float* k_weight, int64_t rows, int hc,
                          int64_t d, const EngramGateSaved& saved, const float* dout, float* dX, float* dkv, float* dq_weight,
                          float* dk_weight, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
