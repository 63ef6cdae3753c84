#pragma once
// Engram (model.py Engram): n-gram hash rows gathered from an fp8 table, projected to one key per
// residual stream and a shared value, and gated into each stream by how well key and stream agree.
#include <cstdint>

namespace dsv41 {

// out [cols, hd] (bf16 values) = table rows `ids`, dequantized: e4m3 times the row's ue8m0 scale
// per 32 values. table [rows, hd] e4m3 bytes, scales [rows, hd / 32].
void engram_gather(const uint8_t* table, const uint8_t* scales, int64_t hd, const int64_t* ids, int cols, float* out);

// X [hc, d] (bf16 values) += gate_m · value per stream m, where kv = [key_0 .. key_{hc-1}, value]
// ([(hc + 1) d], bf16 values), qk [hc, d] = q_weight ⊙ k_weight in fp32, and
// gate_m = σ(signed √ of the normalized dot of stream m and key m). Result rounded to bf16.
void engram_gate(float* X, const float* kv, const float* qk, int hc, int64_t d, float eps);

}  // namespace dsv41
