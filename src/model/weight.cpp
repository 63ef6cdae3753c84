#include "model/weight.h"

#include <cstring>

#include "base/error.h"
#include "model/safetensors.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41 {

float Weight::at(int64_t r, int64_t c) const {
  switch (format) {
    case WeightFormat::F32: {
      float v;
      std::memcpy(&v, data + 4 * (r * cols + c), 4);
      return v;
    }
    case WeightFormat::BF16: {
      uint16_t b;
      std::memcpy(&b, data + 2 * (r * cols + c), 2);
      return bf16_to_float(b);
    }
    case WeightFormat::FP8: {
      const int64_t scale_cols = (cols + 31) / 32;
      return e4m3_to_float(data[r * cols + c]) * e8m0_to_float(scale[(r / 32) * scale_cols + c / 32]);
    }
    case WeightFormat::FP4: {
      const uint8_t byte = data[(r * cols + c) / 2];
      const uint8_t nibble = (c % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      return e2m1_to_float(nibble) * e8m0_to_float(scale[r * (cols / 32) + c / 32]);
    }
  }
  return 0;
}

void Weight::row(int64_t r, float* out) const {
  if (format == WeightFormat::F32) {
    std::memcpy(out, data + 4 * r * cols, size_t(4 * cols));
  } else if (format == WeightFormat::BF16) {
    const uint8_t* p = data + 2 * r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = bf16_to_float(uint16_t(p[2 * c] | (p[2 * c + 1] << 8)));
  } else {
    for (int64_t c = 0; c < cols; ++c) out[c] = at(r, c);
  }
}

int64_t Weight::data_bytes() const {
  const int64_t n = rows * cols;
  switch (format) {
    case WeightFormat::F32: return 4 * n;
    case WeightFormat::BF16: return 2 * n;
    case WeightFormat::FP8: return n;
    case WeightFormat::FP4: return n / 2;
  }
  return 0;
}

int64_t Weight::scale_bytes() const {
  if (format == WeightFormat::FP8) return int64_t(fp8_weight_scale_count(int(rows), int(cols)));
  if (format == WeightFormat::FP4) return int64_t(fp4_weight_scale_count(int(rows), int(cols)));
  return 0;
}

Weight weight_of(const TensorView& t, const TensorView* scale) {
  Weight w;
  w.rows = t.shape.empty() ? 1 : t.shape[0];
  w.cols = t.shape.size() >= 2 ? t.shape[1] : (t.shape.empty() ? 1 : t.shape[0]);
  if (t.shape.size() == 1) w.rows = 1;
  w.data = t.data;
  switch (t.dtype) {
    case DType::F32: w.format = WeightFormat::F32; break;
    case DType::BF16: w.format = WeightFormat::BF16; break;
    case DType::F8_E4M3: w.format = WeightFormat::FP8; break;
    case DType::I8:
      w.format = WeightFormat::FP4;
      w.cols *= 2;  // two e2m1 per byte
      break;
    default: fail("tensor '" + t.name + "'", "a weight dtype (F32, BF16, F8_E4M3, I8)", dtype_name(t.dtype));
  }
  if (w.quantized()) {
    if (!scale) fail("tensor '" + t.name + "'", "a .scale companion", "none");
    w.scale = scale->data;
  }
  return w;
}

}  // namespace dsv41
