#include "numerics/codecs.h"

#include <string>

#include "base/error.h"

namespace dsv41 {
namespace {

void require_blocks(const char* where, int d, int block) {
  if (block <= 0) fail(where, "a positive block size", "block = " + std::to_string(block));
  if (d <= 0 || d % block != 0)
    fail(where, "a length that is a positive multiple of " + std::to_string(block), "d = " + std::to_string(d));
}

float block_amax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = x[i] < 0.0f ? -x[i] : x[i];
    amax = a > amax ? a : amax;
  }
  return amax;
}

// The e2m1 elements of a block, x / scale, two to a byte with the even element in the low nibble.
// The division (not a multiplication by 1/scale) is the reference's; e2m1_from_float saturates at ±6,
// which is the reference's clamp.
void encode_e2m1(const float* x, int n, float scale, uint8_t* packed) {
  for (int i = 0; i < n / 2; ++i) {
    const uint8_t lo = e2m1_from_float(x[2 * i] / scale);
    const uint8_t hi = e2m1_from_float(x[2 * i + 1] / scale);
    packed[i] = uint8_t(lo | (hi << 4));
  }
}

void decode_e2m1(const uint8_t* packed, int n, float scale, float* out) {
  for (int i = 0; i < n / 2; ++i) {
    out[2 * i] = e2m1_to_float(packed[i] & 0x0F) * scale;
    out[2 * i + 1] = e2m1_to_float(packed[i] >> 4) * scale;
  }
}

void fake_quant_e2m1(float* x, int n, float scale) {
  for (int i = 0; i < n; ++i) x[i] = e2m1_to_float(e2m1_from_float(x[i] / scale)) * scale;
}

void encode_e4m3(const float* x, int n, float scale, uint8_t* q) {
  for (int i = 0; i < n; ++i) q[i] = e4m3_from_float(x[i] / scale);
}

void decode_e4m3(const uint8_t* q, int n, float scale, float* out) {
  for (int i = 0; i < n; ++i) out[i] = e4m3_to_float(q[i]) * scale;
}

void fake_quant_e4m3(float* x, int n, float scale) {
  for (int i = 0; i < n; ++i) x[i] = e4m3_to_float(e4m3_from_float(x[i] / scale)) * scale;
}

}  // namespace

// ---- KV-FP4 and MXFP4: e2m1 elements, one scale per block ----
// The two differ only in block size and in how a block's scale is chosen and stored (an e4m3 value
// for KV-FP4, a power of two as ue8m0 for MXFP4): one set of loops serves both.

namespace {

template <int Block, float (*Scale)(float), uint8_t (*StoreScale)(float), float (*LoadScale)(uint8_t)>
struct E2m1Codec {
  static void encode(const char* name, const float* x, int d, uint8_t* out) {
    require_blocks(name, d, Block);
    uint8_t* scales = out + std::size_t(d) / 2;
    for (int b = 0; b < d / Block; ++b) {
      const float scale = Scale(block_amax(x + b * Block, Block));
      scales[b] = StoreScale(scale);  // exact: the scale is a value of its own format
      encode_e2m1(x + b * Block, Block, scale, out + b * Block / 2);
    }
  }
  static void decode(const char* name, const uint8_t* in, int d, float* out) {
    require_blocks(name, d, Block);
    const uint8_t* scales = in + std::size_t(d) / 2;
    for (int b = 0; b < d / Block; ++b) decode_e2m1(in + b * Block / 2, Block, LoadScale(scales[b]), out + b * Block);
  }
  static void quantize_dequantize(const char* name, float* x, int d) {
    require_blocks(name, d, Block);
    for (int b = 0; b < d / Block; ++b) {
      float* block = x + b * Block;
      fake_quant_e2m1(block, Block, Scale(block_amax(block, Block)));
    }
  }
};

using KvFp4 = E2m1Codec<kv_fp4::kBlock, kv_fp4::block_scale, e4m3_from_float, e4m3_to_float>;
using MxFp4 = E2m1Codec<mxfp4::kBlock, mxfp4::block_scale, e8m0_from_pow2, e8m0_to_float>;

}  // namespace

void kv_fp4::encode(const float* x, int d, uint8_t* out) { KvFp4::encode("kv_fp4::encode", x, d, out); }
void kv_fp4::decode(const uint8_t* in, int d, float* out) { KvFp4::decode("kv_fp4::decode", in, d, out); }
void kv_fp4::quantize_dequantize(float* x, int d) { KvFp4::quantize_dequantize("kv_fp4::quantize_dequantize", x, d); }

void mxfp4::encode(const float* x, int d, uint8_t* out) { MxFp4::encode("mxfp4::encode", x, d, out); }
void mxfp4::decode(const uint8_t* in, int d, float* out) { MxFp4::decode("mxfp4::decode", in, d, out); }
void mxfp4::quantize_dequantize(float* x, int d) { MxFp4::quantize_dequantize("mxfp4::quantize_dequantize", x, d); }

// ---- SWA-FP8 and the activation quantization ----

void swa_fp8::encode(const float* x, int d, uint8_t* out) {
  require_blocks("swa_fp8::encode", d, kBlock);
  uint8_t* scales = out + scales_offset(d);
  for (int b = 0; b < d / kBlock; ++b) {
    const float scale = block_scale(block_amax(x + b * kBlock, kBlock));
    scales[b] = e8m0_from_pow2(scale);
    encode_e4m3(x + b * kBlock, kBlock, scale, out + b * kBlock);
  }
}

void swa_fp8::decode(const uint8_t* in, int d, float* out) {
  require_blocks("swa_fp8::decode", d, kBlock);
  const uint8_t* scales = in + scales_offset(d);
  for (int b = 0; b < d / kBlock; ++b)
    decode_e4m3(in + b * kBlock, kBlock, e8m0_to_float(scales[b]), out + b * kBlock);
}

void swa_fp8::quantize_dequantize(float* x, int d) { act_quant_fp8(x, d, kBlock); }

void act_quant_fp8(float* x, int n, int block) {
  require_blocks("act_quant_fp8", n, block);
  for (int b = 0; b < n / block; ++b) {
    float* values = x + std::size_t(b) * block;
    fake_quant_e4m3(values, block, swa_fp8::block_scale(block_amax(values, block)));
  }
}

// ---- Weights ----

namespace {

void require_shape(const char* where, int out, int in) {
  if (out <= 0 || in <= 0)
    fail(where, "a positive shape", "[" + std::to_string(out) + ", " + std::to_string(in) + "]");
}

}  // namespace

void quantize_fp8_weight(const float* w, int out, int in, uint8_t* q, uint8_t* scales) {
  require_shape("quantize_fp8_weight", out, in);
  const int block_cols = (in + kWeightBlock - 1) / kWeightBlock;
  for (int r0 = 0; r0 < out; r0 += kWeightBlock) {
    const int rows = out - r0 < kWeightBlock ? out - r0 : kWeightBlock;
    for (int c0 = 0; c0 < in; c0 += kWeightBlock) {
      const int cols = in - c0 < kWeightBlock ? in - c0 : kWeightBlock;
      float amax = 0.0f;
      for (int r = r0; r < r0 + rows; ++r) {
        const float row_amax = block_amax(w + std::size_t(r) * in + c0, cols);
        amax = row_amax > amax ? row_amax : amax;
      }
      const float scale = fp8_weight_block_scale(amax);
      scales[(r0 / kWeightBlock) * block_cols + c0 / kWeightBlock] = e8m0_from_pow2(scale);
      for (int r = r0; r < r0 + rows; ++r) {
        const std::size_t at = std::size_t(r) * in + c0;
        encode_e4m3(w + at, cols, scale, q + at);
      }
    }
  }
}

void dequantize_fp8_weight(const uint8_t* q, const uint8_t* scales, int out, int in, float* w) {
  require_shape("dequantize_fp8_weight", out, in);
  const int block_cols = (in + kWeightBlock - 1) / kWeightBlock;
  for (int r = 0; r < out; ++r) {
    const uint8_t* row_scales = scales + (r / kWeightBlock) * block_cols;
    for (int c0 = 0; c0 < in; c0 += kWeightBlock) {
      const int cols = in - c0 < kWeightBlock ? in - c0 : kWeightBlock;
      const std::size_t at = std::size_t(r) * in + c0;
      decode_e4m3(q + at, cols, e8m0_to_float(row_scales[c0 / kWeightBlock]), w + at);
    }
  }
}

void quantize_fp4_weight(const float* w, int out, int in, uint8_t* q, uint8_t* scales) {
  require_shape("quantize_fp4_weight", out, in);
  require_blocks("quantize_fp4_weight", in, kWeightBlock);
  const int blocks = in / kWeightBlock;
  for (int r = 0; r < out; ++r) {
    for (int b = 0; b < blocks; ++b) {
      const float* x = w + std::size_t(r) * in + b * kWeightBlock;
      const float scale = fp4_weight_block_scale(block_amax(x, kWeightBlock));
      scales[std::size_t(r) * blocks + b] = e8m0_from_pow2(scale);
      encode_e2m1(x, kWeightBlock, scale, q + (std::size_t(r) * in + b * kWeightBlock) / 2);
    }
  }
}

void dequantize_fp4_weight(const uint8_t* q, const uint8_t* scales, int out, int in, float* w) {
  require_shape("dequantize_fp4_weight", out, in);
  require_blocks("dequantize_fp4_weight", in, kWeightBlock);
  const int blocks = in / kWeightBlock;
  for (int r = 0; r < out; ++r) {
    for (int b = 0; b < blocks; ++b) {
      const std::size_t at = std::size_t(r) * in + b * kWeightBlock;
      decode_e2m1(q + at / 2, kWeightBlock, e8m0_to_float(scales[std::size_t(r) * blocks + b]), w + at);
    }
  }
}

}  // namespace dsv41
