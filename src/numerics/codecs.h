#pragma once
// Block codecs of DeepSeek-V4.1: how a vector (or a weight matrix) of floats becomes small elements
// plus one scale per block, and back. docs/formats.md gives each byte layout.
//
// Every codec offers encode (floats -> bytes), decode (bytes -> floats) and quantize_dequantize, the
// reference's in-place fake quantization (act_quant / fp4_act_quant with inplace=True):
// quantize_dequantize(x) == decode(encode(x)) bit for bit. The reference runs on bf16 inputs and
// writes its result back as bf16; every dequantized value here (a small-format value times a scale)
// is exactly representable in bf16, so for bf16 inputs our floats equal the reference's output.
//
// A vector length `d` must be a positive multiple of the codec's block; otherwise dsv41::Error.
// Encoders and decoders do not allocate.
#include <cstddef>
#include <cstdint>

#include "numerics/types.h"

namespace dsv41 {

// The DeepSeek power-of-two scale (kernel.py fast_round_scale): amax is raised to `min_amax` so an
// all-zero block still gets a usable scale, multiplied by the fp32 reciprocal of the element
// format's maximum, as the kernels do, and rounded up to a power of two, so amax / scale never
// exceeds the maximum and nothing clips. For every normal amax this equals the exact
// 2^ceil(log2(amax / max)); the tests check that over a whole binade.
DSV41_HD inline float pow2_block_scale(float amax, float min_amax, float inv_max) {
  return pow2_ceil((amax < min_amax ? min_amax : amax) * inv_max);
}

// ---- KV-FP4: compressed main KV (V4.1). e2m1 elements, one e4m3 scale per 16, no tensor scale. ----
// Entry of d floats: [0, d/2) packed nibbles, element 2i in the low nibble of byte i and 2i+1 in
// the high one; [d/2, d/2 + d/16) the e4m3 scales. 288 bytes for d = 512.
namespace kv_fp4 {

inline constexpr int kBlock = 16;
inline constexpr float kMaxMagnitude = kE2M1Max * kE4M3Max;  // 2688: the largest decodable value

DSV41_HD constexpr std::size_t bytes(int d) { return std::size_t(d) / 2 + std::size_t(d) / kBlock; }
DSV41_HD constexpr std::size_t scales_offset(int d) { return std::size_t(d) / 2; }

// e4m3(clamp(amax / 6, 2^-9, 448)), the value a block is divided by (kernel.py fp4_act_quant with
// e4m3 scales). The floor 2^-9 is the smallest e4m3 subnormal, so the scale is never zero; the true
// fp32 division amax / 6 is the reference's, not a multiplication by 1/6.
DSV41_HD inline float block_scale(float amax) {
  const float min_amax = kE2M1Max * 0x1p-9f;
  return e4m3_to_float(e4m3_from_float((amax < min_amax ? min_amax : amax) / kE2M1Max));
}

void encode(const float* x, int d, uint8_t* out);
void decode(const uint8_t* in, int d, float* out);
void quantize_dequantize(float* x, int d);

}  // namespace kv_fp4

// ---- MXFP4, DeepSeek variant: indexer Q and K. e2m1 elements, one ue8m0 scale per 32. ----
// Entry of d floats: [0, d/2) packed nibbles (same order as KV-FP4); [d/2, d/2 + d/32) the ue8m0
// scales. 68 bytes for d = 128. OCP MX chooses 2^(floor(log2 amax) - 2) and may clip; DeepSeek
// rounds the scale up instead, so no element clips.
namespace mxfp4 {

inline constexpr int kBlock = 32;

DSV41_HD constexpr std::size_t bytes(int d) { return std::size_t(d) / 2 + std::size_t(d) / kBlock; }
DSV41_HD constexpr std::size_t scales_offset(int d) { return std::size_t(d) / 2; }

// 2^ceil(log2(max(amax, 6 * 2^-126) / 6)) (kernel.py fp4_act_quant with ue8m0 scales): at least 2^-126.
DSV41_HD inline float block_scale(float amax) {
  return pow2_block_scale(amax, kE2M1Max * 0x1p-126f, 1.0f / kE2M1Max);
}

void encode(const float* x, int d, uint8_t* out);
void decode(const uint8_t* in, int d, float* out);
void quantize_dequantize(float* x, int d);

}  // namespace mxfp4

// ---- SWA-FP8: sliding-window KV. e4m3 elements, one ue8m0 scale per 32. ----
// Entry of d floats: [0, d) e4m3 bytes; [d, d + d/32) the ue8m0 scales. 528 bytes for d = 512.
namespace swa_fp8 {

inline constexpr int kBlock = 32;

DSV41_HD constexpr std::size_t bytes(int d) { return std::size_t(d) + std::size_t(d) / kBlock; }
DSV41_HD constexpr std::size_t scales_offset(int d) { return std::size_t(d); }

// 2^ceil(log2(max(amax, 1e-4) / 448)) (kernel.py act_quant with scale_fmt ue8m0). An all-zero
// block gets 2^-22.
DSV41_HD inline float block_scale(float amax) { return pow2_block_scale(amax, 1e-4f, 1.0f / kE4M3Max); }

void encode(const float* x, int d, uint8_t* out);
void decode(const uint8_t* in, int d, float* out);
void quantize_dequantize(float* x, int d);

}  // namespace swa_fp8

// The activation fake quantization in front of every fp8 and fp4 GEMM (model.py linear ->
// act_quant with ue8m0 scales): the SWA-FP8 rule, over blocks of `block` values (32 in V4.1).
// `n` must be a positive multiple of `block`.
void act_quant_fp8(float* x, int n, int block);

// ---- Weights ----
// FP8 weight [out, in]: e4m3 bytes, row-major, plus a ue8m0 scale per 32x32 block, scale tensor
// [ceil(out/32), ceil(in/32)] row-major; edge blocks are partial. FP4 weight [out, in]: bytes
// [out, in/2] packed along `in` (element 2i in the low nibble), plus a ue8m0 scale per 32 values
// of a row, scale tensor [out, in/32]; `in` must be a multiple of 32.
//
// Quantization picks each block's scale as 2^ceil(log2(amax / max)), amax floored at max * 2^-126
// so that every block (an all-zero one too) gets a normal, storable scale. For fp4 this is exactly
// the MXFP4 rule. DeepSeek ships its weights already quantized; this is for writing test
// checkpoints and for CPU reference GEMMs.
inline constexpr int kWeightBlock = 32;

DSV41_HD constexpr std::size_t fp8_weight_scale_count(int out, int in) {
  return std::size_t((out + kWeightBlock - 1) / kWeightBlock) * std::size_t((in + kWeightBlock - 1) / kWeightBlock);
}
DSV41_HD constexpr std::size_t fp4_weight_bytes(int out, int in) { return std::size_t(out) * std::size_t(in) / 2; }
DSV41_HD constexpr std::size_t fp4_weight_scale_count(int out, int in) {
  return std::size_t(out) * std::size_t(in / kWeightBlock);
}

DSV41_HD inline float fp8_weight_block_scale(float amax) {
  return pow2_block_scale(amax, kE4M3Max * 0x1p-126f, 1.0f / kE4M3Max);
}
DSV41_HD inline float fp4_weight_block_scale(float amax) { return mxfp4::block_scale(amax); }

// q: out*in bytes; scales: fp8_weight_scale_count(out, in) bytes.
void quantize_fp8_weight(const float* w, int out, int in, uint8_t* q, uint8_t* scales);
void dequantize_fp8_weight(const uint8_t* q, const uint8_t* scales, int out, int in, float* w);

// q: fp4_weight_bytes(out, in) bytes; scales: fp4_weight_scale_count(out, in) bytes.
void quantize_fp4_weight(const float* w, int out, int in, uint8_t* q, uint8_t* scales);
void dequantize_fp4_weight(const uint8_t* q, const uint8_t* scales, int out, int in, float* w);

}  // namespace dsv41
