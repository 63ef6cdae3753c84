#include "train/trainer/release_checkpoint.h"

#include <cstring>

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::train {

namespace {

// The stored bytes of tensor `t` from its master values, and of its scale tensor `scale` when it
// has one (the weights map lists a quantized tensor's scales right after it).
void add_tensor(ShardedWriter& out, const TensorSpec& t, const TensorSpec* scale, const std::vector<float>& w) {
  if (int64_t(w.size()) != t.params)
    fail("checkpoint tensor '" + t.name + "'", std::to_string(t.params) + " master values", std::to_string(w.size()));
  const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 1;
  const int64_t cols = int64_t(w.size()) / rows;
  std::vector<uint8_t> bytes(size_t(t.nbytes())), scales(scale ? size_t(scale->nbytes()) : 0);
  switch (t.dtype) {
    case DType::F32: std::memcpy(bytes.data(), w.data(), bytes.size()); break;
    case DType::BF16:
      for (size_t i = 0; i < w.size(); ++i) {
        const uint16_t b = bf16_from_float(w[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
      }
      break;
    case DType::F8_E4M3:
      if (t.role == WeightRole::Lookup) {
        // The Engram table: each row as an SWA-FP8 entry, [cols e4m3 | cols/32 ue8m0], split into
        // the table's row and the scale tensor's row.
        std::vector<uint8_t> entry(swa_fp8::bytes(int(cols)));
        for (int64_t r = 0; r < rows; ++r) {
          swa_fp8::encode(w.data() + r * cols, int(cols), entry.data());
          std::memcpy(bytes.data() + r * cols, entry.data(), size_t(cols));
          std::memcpy(scales.data() + r * (cols / 32), entry.data() + swa_fp8::scales_offset(int(cols)), size_t(cols / 32));
        }
      } else {
        quantize_fp8_weight(w.data(), int(rows), int(cols), bytes.data(), scales.data());
      }
      break;
    case DType::I8: quantize_fp4_weight(w.data(), int(rows), int(cols), bytes.data(), scales.data()); break;
    default: fail("checkpoint tensor '" + t.name + "'", "a weight format (F32, BF16, F8_E4M3, I8)", dtype_name(t.dtype));
  }
  out.add(t.name, t.dtype, t.shape, std::move(bytes));
  if (scale) out.add(scale->name, scale->dtype, scale->shape, std::move(scales));
}

}  // namespace

void write_release_checkpoint(const Parameters<float>& params, const std::string& dir, const ReleaseFiles& files) {
  const Config& c = params.config();
  const std::vector<TensorSpec> specs = expected_tensors(c);
  ShardedWriter out(dir, files.max_shard_bytes);
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& t = specs[i];
    if (t.role == WeightRole::Scale) continue;  // written with its tensor, the one before it
    const TensorSpec* scale = i + 1 < specs.size() && specs[i + 1].role == WeightRole::Scale ? &specs[i + 1] : nullptr;
    const bool quantized = t.dtype == DType::F8_E4M3 || t.dtype == DType::I8;
    if (quantized != (scale != nullptr))
      fail("weights map, tensor '" + t.name + "'", quantized ? "its scale tensor after it" : "no scale tensor after it",
           scale ? "'" + scale->name + "'" : "none");
    add_tensor(out, t, scale, params.at(t.name).value);
  }
  out.finish();
  write_text_atomically(dir + "/tokenizer.json", files.tokenizer_json);
  write_text_atomically(dir + "/tokenizer_config.json", files.tokenizer_config_json);
  write_text_atomically(dir + "/config.json", to_official_json(c));
}

}  // namespace dsv41::train
