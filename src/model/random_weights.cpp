#include "model/random_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/counter_random.h"
#include "base/error.h"
#include "model/checkpoint.h"
#include "model/safetensors.h"
#include "model/stored_tensor.h"
#include "model/weights.h"

namespace dsv41 {

namespace {

// How a tensor is filled: uniform noise of standard deviation `std` around `mean`, or a
// per-element function for the few tensors with structure (mHC biases).
struct Fill {
  double mean = 0, std = 0;
  uint64_t key = 0;
  std::function<float(int64_t)> custom;
  int64_t live = INT64_MAX;  // elements from this index on are zero

  float at(int64_t i) const {
    if (i >= live) return 0;
    if (custom) return custom(i);
    if (std == 0) return float(mean);
    // Uniform on [-a, a) has standard deviation a / sqrt(3).
    double u = double(splitmix64(key + uint64_t(i) * 0xD1B54A32D192ED03ull) >> 11) * 0x1.0p-53;
    return float(mean + (2 * u - 1) * std * std::sqrt(3.0));
  }
};

// Initial values chosen so that a forward pass on random weights keeps every activation O(1):
// linears at 1/sqrt(fan-in) (unit-variance outputs for unit-variance inputs), norm weights at 1,
// and mHC close to its identity-like start (comb's base favours the diagonal). The rows of an
// output head past the tokenizer's `token_ids` are zero: padding ids (no text) get logit 0, below
// the largest of the real ids' random logits, so greedy decoding never emits one.
Fill fill_for(const Config& c, const TensorSpec& t, uint64_t seed, int64_t token_ids) {
  Fill f;
  f.key = name_key(seed, t.name);
  if (t.role == WeightRole::Head && t.shape.size() == 2 && t.shape[0] == c.vocab_size) f.live = token_ids * t.shape[1];
  const std::string& n = t.name;
  int64_t fan_in = t.shape.size() == 2 ? t.shape[1] * (t.dtype == DType::I8 ? 2 : 1) : 1;
  if (n.ends_with("norm.weight") || n.ends_with("norm1.weight") || n.ends_with("norm2.weight") ||
      n.ends_with("q_weight") || n.ends_with("k_weight")) {
    f.mean = 1;
  } else if (n.ends_with("_base")) {
    const int hc = c.hc_mult;
    f.custom = [hc](int64_t i) {
      if (i < 2 * hc) return 0.0f;  // pre = sigmoid(0) + eps, post = 2 sigmoid(0) = 1
      int64_t j = i - 2 * hc;
      return j / hc == j % hc ? 2.0f : 0.0f;  // comb: mostly the identity after Sinkhorn
    };
  } else if (n.ends_with("_scale") && t.dtype == DType::F32) {
    f.mean = 0.1;
  } else if (n.ends_with("attn_sink") || (n.ends_with(".bias") && t.group == WeightGroup::Vision)) {
    f.mean = 0;
  } else if (n.ends_with("gate.bias") || n.ends_with("gate.bias_vl")) {
    f.std = 0.01;
  } else if (t.role == WeightRole::Lookup || t.shape.size() == 1) {
    f.std = 1;  // embeddings, Engram rows, image delimiters: unit-variance rows
  } else {
    f.std = 1.0 / std::sqrt(double(fan_in));
  }
  return f;
}

std::string scale_name(const std::string& weight_name) {
  return weight_name.substr(0, weight_name.size() - std::strlen("weight")) + "scale";
}

// Produces the stored bytes of one tensor (and of its scale tensor when it has one), stripe by
// stripe of 32 rows so that a large tensor never exists in fp32 all at once.
void write_tensor(ShardedWriter& out, const Config& c, const TensorSpec& t, const TensorSpec* scale, uint64_t seed,
                  int64_t token_ids) {
  const Fill fill = fill_for(c, t, seed, token_ids);
  StoredTensor stored(t);
  std::vector<float> stripe;
  constexpr int64_t kStripe = 32;
  for (int64_t r0 = 0; r0 < stored.rows; r0 += kStripe) {
    const int64_t h = std::min(kStripe, stored.rows - r0);
    stripe.resize(size_t(h * stored.width));
    for (int64_t i = 0; i < h * stored.width; ++i) stripe[size_t(i)] = fill.at(r0 * stored.width + i);
    stored.encode_rows(stripe.data(), r0, h);
  }
  out.add(t.name, t.dtype, t.shape, std::move(stored.bytes));
  if (scale) {
    if (int64_t(stored.scales.size()) != scale->nbytes())
      fail(scale->name, std::to_string(scale->nbytes()) + " scale bytes", std::to_string(stored.scales.size()));
    out.add(scale->name, scale->dtype, scale->shape, std::move(stored.scales));
  } else if (!stored.scales.empty()) {
    fail(t.name, "a scale tensor after it in the weights map", "none");
  }
}

}  // namespace

void write_random_weights(const Config& c, const std::string& dir, const RandomWeightsOptions& opt) {
  validate(c);
  const int64_t token_ids = opt.token_ids < 0 ? c.vocab_size : opt.token_ids;
  const std::vector<TensorSpec> specs = expected_tensors(c);
  int64_t total = 0, done = 0;
  for (const TensorSpec& t : specs) total += t.nbytes();

  ShardedWriter out(dir, opt.max_shard_bytes);  // refuses a directory with a checkpoint
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorSpec& t = specs[i];
    if (t.role == WeightRole::Scale) continue;  // written together with its weight below
    // Quantized tensors are followed in the map by their scale tensor; produce both at once.
    const bool has_scale = i + 1 < specs.size() && specs[i + 1].role == WeightRole::Scale;
    if (has_scale && specs[i + 1].name != scale_name(t.name))
      fail("weights map", "scale '" + scale_name(t.name) + "' after '" + t.name + "'", "'" + specs[i + 1].name + "'");
    write_tensor(out, c, t, has_scale ? &specs[i + 1] : nullptr, opt.seed, token_ids);
    done += t.nbytes() + (has_scale ? specs[i + 1].nbytes() : 0);
    if (opt.progress) opt.progress(done, total);
  }
  out.finish();
  for (const auto& [name, text] : opt.files) write_text_atomically(dir + "/" + name, text);
  write_text_atomically(dir + "/config.json", to_official_json(c));  // last: a directory with a config is complete
}

}  // namespace dsv41
