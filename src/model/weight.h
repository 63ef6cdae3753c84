#pragma once
// A weight matrix as the checkpoint stores it, seen in place (zero-copy over the mapped file):
// the op set reads every format directly and dequantizes inside its loops.
#include <cstdint>

namespace dsv41 {

struct TensorView;

enum class WeightFormat {
  F32,   // fp32 values
  BF16,  // bf16 values
  FP8,   // e4m3 values, one ue8m0 scale per 32x32 block: scale [ceil(rows/32), ceil(cols/32)]
  FP4,   // e2m1 pairs (element 2i in the low nibble), one ue8m0 scale per 32 along a row: [rows, cols/32]
};

// A logical [rows, cols] matrix (rows = output features, cols = input features, as torch's Linear).
struct Weight {
  WeightFormat format = WeightFormat::F32;
  int64_t rows = 0, cols = 0;
  const uint8_t* data = nullptr;
  const uint8_t* scale = nullptr;

  bool quantized() const { return format == WeightFormat::FP8 || format == WeightFormat::FP4; }
  // Bytes of the stored values and of the block scales (what one full read of the weight moves).
  int64_t data_bytes() const;
  int64_t scale_bytes() const;
  // Dequantized element (r, c): for tests and for the few places that need single values.
  float at(int64_t r, int64_t c) const;
  // Dequantizes row r into out[cols].
  void row(int64_t r, float* out) const;
};

// A 1-D or 2-D tensor as a weight; `scale` is the tensor's .scale companion (quantized only).
Weight weight_of(const TensorView& tensor, const TensorView* scale = nullptr);

// The mHC weights of one sub-layer (model.py Block's hc_attn_* / hc_ffn_*).
struct HcWeights {
  Weight fn;     // [(2 + hc) hc, hc d] fp32
  Weight base;   // [(2 + hc) hc] fp32
  Weight scale;  // [3] fp32
};

}  // namespace dsv41
