#include "model/stored_tensor.h"

#include <cstring>

#include "base/error.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41 {

StoredTensor::StoredTensor(const TensorSpec& t) : spec(t) {
  const bool matrix = t.shape.size() == 2;
  rows = matrix ? t.shape[0] : 1;
  width = matrix ? t.shape[1] * (t.dtype == DType::I8 ? 2 : 1) : (t.shape.empty() ? 1 : t.shape[0]);
  bytes.resize(size_t(t.nbytes()));
  if (t.dtype == DType::F8_E4M3 && t.role == WeightRole::Lookup) scales.resize(size_t(rows * (width / 32)));
  else if (t.dtype == DType::F8_E4M3) scales.resize(fp8_weight_scale_count(int(rows), int(width)));
  else if (t.dtype == DType::I8) scales.resize(fp4_weight_scale_count(int(rows), int(width)));
}

void StoredTensor::encode_rows(const float* values, int64_t r0, int64_t n) {
  const size_t base = size_t(r0 * width), count = size_t(n * width);
  switch (spec.dtype) {
    case DType::F32: std::memcpy(bytes.data() + base * 4, values, count * 4); break;
    case DType::BF16:
      for (size_t i = 0; i < count; ++i) {
        const uint16_t b = bf16_from_float(values[i]);
        std::memcpy(bytes.data() + (base + i) * 2, &b, 2);
      }
      break;
    case DType::F8_E4M3:
      if (spec.role == WeightRole::Lookup) {
        // The Engram table: each row an SWA-FP8 entry, [width e4m3 | width/32 ue8m0], split into
        // the table's row and the scale tensor's row.
        std::vector<uint8_t> entry(swa_fp8::bytes(int(width)));
        for (int64_t r = 0; r < n; ++r) {
          swa_fp8::encode(values + r * width, int(width), entry.data());
          std::memcpy(bytes.data() + base + size_t(r * width), entry.data(), size_t(width));
          std::memcpy(scales.data() + size_t((r0 + r) * (width / 32)), entry.data() + swa_fp8::scales_offset(int(width)),
                      size_t(width / 32));
        }
      } else {
        quantize_fp8_weight(values, int(n), int(width), bytes.data() + base, scales.data() + size_t(r0 / 32) * size_t((width + 31) / 32));
      }
      break;
    case DType::I8:
      quantize_fp4_weight(values, int(n), int(width), bytes.data() + base / 2, scales.data() + size_t(r0) * size_t(width / 32));
      break;
    default: fail("tensor '" + spec.name + "'", "a weight format (F32, BF16, F8_E4M3, I8)", dtype_name(spec.dtype));
  }
}

}  // namespace dsv41
