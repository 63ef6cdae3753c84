#include "train/trainer/release_checkpoint.h"

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/stored_tensor.h"
#include "model/weights.h"

namespace dsv41::train {

namespace {

// The stored bytes of tensor `t` from its master values, and of its scale tensor `scale` when it
// has one (the weights map lists a quantized tensor's scales right after it).
void add_tensor(ShardedWriter& out, const TensorSpec& t, const TensorSpec* scale, const std::vector<float>& w) {
  if (int64_t(w.size()) != t.params)
    fail("checkpoint tensor '" + t.name + "'", std::to_string(t.params) + " master values", std::to_string(w.size()));
  StoredTensor stored(t);
  stored.encode_rows(w.data(), 0, stored.rows);
  out.add(t.name, t.dtype, t.shape, std::move(stored.bytes));
  if (scale) out.add(scale->name, scale->dtype, scale->shape, std::move(stored.scales));
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
