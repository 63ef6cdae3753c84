#include "model/config.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "base/error.h"
#include "model/json_document.h"

namespace dsv41 {

using json = nlohmann::json;

const char* layer_kind_name(LayerKind kind) {
  switch (kind) {
    case LayerKind::Swa: return "SWA";
    case LayerKind::Full: return "Full";
    case LayerKind::Reindex: return "Reindex";
    case LayerKind::Reuse: return "Reuse";
  }
  return "?";
}

// --- derived queries ----------------------------------------------------------------------------

static bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

bool Config::is_kv_source(int layer) const { return layer < n_layers && contains(kv_source_layers, layer); }
bool Config::is_index_source(int layer) const { return layer < n_layers && contains(index_source_layers, layer); }

LayerKind Config::layer_kind(int layer) const {
  if (compress_ratios.at(layer) == 0) return LayerKind::Swa;
  if (is_kv_source(layer)) return LayerKind::Full;
  if (is_index_source(layer)) return LayerKind::Reindex;
  return LayerKind::Reuse;
}

int Config::engram_index(int layer) const {
  const auto at = std::find(engram_layer_ids.begin(), engram_layer_ids.end(), layer);
  return at == engram_layer_ids.end() ? -1 : int(at - engram_layer_ids.begin());
}

int Config::kv_source_of(int layer) const {
  if (layer >= n_layers || compress_ratios.at(layer) == 0) return -1;
  int source = -1;
  for (int s : kv_source_layers)
    if (s <= layer) source = s;
  return source;
}

int Config::dspark_target_index(int layer) const {
  if (!has_dspark()) return -1;
  int index = 0;
  bool found = false;
  for (int t : dspark_target_layer_ids) {
    if (t < layer) ++index;
    found = found || t == layer;
  }
  return found ? index : -1;
}

int Config::decoder_start() const {
  for (int s : kv_source_layers)
    if (compress_ratios.at(s) == 1) return s;
  return n_layers;
}

int Config::routed_experts(int layer) const {
  return layer >= n_layers && dspark_n_routed_experts > 0 ? dspark_n_routed_experts : n_routed_experts;
}

int Config::activated_experts(int layer) const {
  return layer >= n_layers && dspark_n_activated_experts > 0 ? dspark_n_activated_experts : n_activated_experts;
}

// --- Engram prime layout ------------------------------------------------------------------------

// Miller-Rabin with the first 12 primes as bases: exact for every n below 3.3e24, so for every
// int64_t, at a dozen modular powers instead of up to 2^20 divisions near 2^40.
static bool is_prime(int64_t n) {
  if (n < 2) return false;
  constexpr uint64_t kBases[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37};
  for (uint64_t b : kBases)
    if (uint64_t(n) % b == 0) return uint64_t(n) == b;
  const uint64_t m = uint64_t(n);
  auto mul = [m](uint64_t a, uint64_t b) { return uint64_t((unsigned __int128)a * b % m); };
  auto power = [&](uint64_t a, uint64_t e) {
    uint64_t r = 1;
    for (; e; e >>= 1, a = mul(a, a))
      if (e & 1) r = mul(r, a);
    return r;
  };
  uint64_t d = m - 1;
  int s = 0;
  for (; d % 2 == 0; d /= 2) ++s;
  for (uint64_t a : kBases) {
    uint64_t x = power(a, d);
    if (x == 1 || x == m - 1) continue;
    bool composite = true;
    for (int i = 1; i < s && composite; ++i) composite = (x = mul(x, x)) != m - 1;
    if (composite) return false;
  }
  return true;
}

std::vector<std::vector<int64_t>> engram_primes(const Config& c) {
  // Every (order, head) restarts its search at engram_vocab_size - 1 but skips primes already
  // taken, so the primes are simply consecutive, layer after layer.
  const int per_layer = c.engram_hash_columns();
  std::vector<std::vector<int64_t>> primes(c.engram_layer_ids.size());
  int64_t p = c.engram_vocab_size - 1;
  for (std::vector<int64_t>& layer : primes)
    for (int k = 0; k < per_layer; ++k) {
      do ++p;
      while (!is_prime(p));
      layer.push_back(p);
    }
  return primes;
}

std::vector<int64_t> engram_table_rows(const Config& c) {
  std::vector<int64_t> rows;
  for (const std::vector<int64_t>& layer : engram_primes(c)) {
    int64_t total = 0;
    for (int64_t p : layer) total += p;
    rows.push_back(total);
  }
  return rows;
}

// --- reading JSON fields ------------------------------------------------------------------------

namespace {

std::string show(const json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

template <class T>
std::string show_list(const std::vector<T>& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
  return os.str();
}

std::string range_text(double lo, double hi) {
  std::ostringstream os;
  os << "in [" << lo << ", " << hi << "]";
  return os.str();
}

std::string range_text(int64_t lo, int64_t hi) { return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }

// Reads the keys of one JSON object into Config fields, each with its type and range, and
// remembers which keys it consumed so that an unknown key can be refused by name.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {
    if (!obj_.is_object()) fail(where_, "a JSON object", show(obj_));
  }

  bool has(const char* key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }

  // An integer in [lo, hi], compared as the JSON holds it: an unsigned above 2^63 - 1 would read
  // as a negative int64_t (2^64 - 1 as -1).
  static bool in_range(const json& v, int64_t lo, int64_t hi) {
    if (!v.is_number_integer()) return false;
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      return hi >= 0 && u <= uint64_t(hi) && (lo <= 0 || u >= uint64_t(lo));
    }
    const int64_t x = v.get<int64_t>();
    return x >= lo && x <= hi;
  }

  void integer(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    const json* v = take(key);
    if (!v) return;
    if (!in_range(*v, lo, hi)) fail(at(key), "an integer " + range_text(lo, hi), show(*v));
    out = v->get<int64_t>();
  }
  // Into an int: the range is cut to the int's, so that 2^32 + 8 is refused, not read as 8.
  void integer(const char* key, int& out, int64_t lo, int64_t hi) {
    int64_t x = out;
    integer(key, x, std::max<int64_t>(lo, INT_MIN), std::min<int64_t>(hi, INT_MAX));
    out = int(x);
  }
  void number(const char* key, double& out, double lo, double hi) {
    const json* v = take(key);
    if (!v) return;
    if (!v->is_number()) fail(at(key), "a number " + range_text(lo, hi), show(*v));
    double x = v->get<double>();
    if (!(x >= lo && x <= hi)) fail(at(key), "a number " + range_text(lo, hi), show(*v));
    out = x;
  }
  void boolean(const char* key, bool& out) {
    const json* v = take(key);
    if (!v) return;
    if (!v->is_boolean()) fail(at(key), "true or false", show(*v));
    out = v->get<bool>();
  }
  void choice(const char* key, std::string& out, std::initializer_list<const char*> allowed) {
    const json* v = take(key);
    if (!v) return;
    std::string names;
    for (const char* a : allowed) names += std::string(names.empty() ? "" : ", ") + '"' + a + '"';
    if (!v->is_string()) fail(at(key), "one of " + names, show(*v));
    std::string s = v->get<std::string>();
    for (const char* a : allowed)
      if (s == a) {
        out = s;
        return;
      }
    fail(at(key), "one of " + names, show(*v));
  }
  // A string that may be null (ModelArgs' `X | None` fields).
  void optional_choice(const char* key, std::optional<std::string>& out, std::initializer_list<const char*> allowed) {
    if (obj_.contains(key) && obj_.at(key).is_null()) {
      seen_.insert(key);
      out.reset();
      return;
    }
    std::string s = out.value_or("");
    bool present = has(key);
    choice(key, s, allowed);
    if (present) out = s;
  }
  void optional_integer(const char* key, std::optional<int>& out, int64_t lo, int64_t hi) {
    if (obj_.contains(key) && obj_.at(key).is_null()) {
      seen_.insert(key);
      out.reset();
      return;
    }
    if (!has(key)) return;
    int x = 0;
    integer(key, x, lo, hi);
    out = x;
  }
  template <class T>
  void integers(const char* key, std::vector<T>& out, int64_t lo, int64_t hi) {
    const json* v = take(key);
    if (!v) return;
    std::string expect = "a list of integers " + range_text(lo, hi);
    if (!v->is_array()) fail(at(key), expect, show(*v));
    std::vector<T> xs;
    lo = std::max<int64_t>(lo, std::numeric_limits<T>::min());
    hi = std::min<int64_t>(hi, std::numeric_limits<T>::max());
    for (size_t i = 0; i < v->size(); ++i) {
      const json& e = (*v)[i];
      if (!in_range(e, lo, hi)) fail(at(std::string(key) + "[" + std::to_string(i) + "]"), expect, show(e));
      xs.push_back(T(e.get<int64_t>()));
    }
    out = std::move(xs);
  }
  // A key that must hold one value because dsv41 implements only that (e.g. one KV head).
  void require(const char* key, const json& value, const std::string& why) {
    const json* v = take(key);
    if (v && *v != value) fail(at(key), show(value) + " (" + why + ")", show(*v));
  }
  // A key that is known and does not change inference (training knobs, bookkeeping).
  void ignore(std::initializer_list<const char*> keys) {
    for (const char* k : keys) seen_.insert(k);
  }
  const json* object(const char* key) {
    const json* v = take(key);
    if (v && !v->is_object()) fail(at(key), "a JSON object", show(*v));
    return v;
  }
  // Every key not consumed is a feature dsv41 does not know: refuse it by name rather than
  // silently computing something else than the checkpoint was trained for.
  void finish() const {
    for (auto& [key, value] : obj_.items())
      if (!seen_.count(key))
        fail(at(key), "a key dsv41 implements", "an unknown key (value " + show(value) + "); dsv41 refuses configs it cannot honour");
  }
  std::string at(const std::string& key) const { return where_ + ": key '" + key + "'"; }

 private:
  const json* take(const char* key) {
    seen_.insert(key);
    if (!obj_.contains(key) || obj_.at(key).is_null()) return nullptr;
    return &obj_.at(key);
  }
  const json& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxExpertTensors = int64_t(1) << 24;
constexpr int64_t kMaxId = int64_t(1) << 40;

// The keys shared by both layouts under the same name.
void read_common(Fields& f, Config& c) {
  f.integer("vocab_size", c.vocab_size, 1, kMaxId);
  f.integer("head_dim", c.head_dim, 1, kMaxDim);
  f.integer("q_lora_rank", c.q_lora_rank, 1, kMaxDim);
  f.integer("o_groups", c.o_groups, 1, kMaxDim);
  f.integer("o_lora_rank", c.o_lora_rank, 1, kMaxDim);
  f.integer("n_routed_experts", c.n_routed_experts, 1, 1 << 16);
  f.integer("n_shared_experts", c.n_shared_experts, 1, 1);
  f.number("gate_temp", c.gate_temp, 1e-6, 1e6);
  f.boolean("norm_topk_prob", c.norm_topk_prob);
  f.number("swiglu_limit", c.swiglu_limit, 0, 1e9);
  f.number("rope_theta", c.rope_theta, 1, 1e12);
  f.number("compress_rope_theta", c.compress_rope_theta, 1, 1e12);
  f.integers("compress_ratios", c.compress_ratios, 0, 1 << 20);
  f.integer("index_n_heads", c.index_n_heads, 1, kMaxDim);
  f.integer("index_head_dim", c.index_head_dim, 1, kMaxDim);
  f.integer("index_topk", c.index_topk, 1, kMaxId);
  f.integer("candidate_topk_blocks", c.candidate_topk_blocks, 0, kMaxId);
  f.integer("candidate_block_size", c.candidate_block_size, 0, kMaxId);
  f.integer("hc_mult", c.hc_mult, 1, 64);
  f.integer("hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1, 1000);
  f.number("hc_eps", c.hc_eps, 0, 1);
  f.integers("engram_layer_ids", c.engram_layer_ids, 0, kMaxLayers - 1);
  f.integers("engram_num_embeddings", c.engram_num_embeddings, 0, kMaxId);
  f.integer("engram_max_ngram_size", c.engram_max_ngram_size, 1, 16);
  f.integer("engram_vocab_size", c.engram_vocab_size, 0, kMaxId);
  f.integer("engram_n_heads", c.engram_n_heads, 0, 1024);
  f.integer("engram_head_dim", c.engram_head_dim, 0, kMaxDim);
  f.integer("engram_pad_id", c.engram_pad_id, 0, kMaxId);
  f.integer("engram_compressed_vocab_size", c.engram_compressed_vocab_size, 0, kMaxId);
  f.integer("image_token_id", c.image_token_id, 0, kMaxId);
  f.integer("dspark_block_size", c.dspark_block_size, 0, 1024);
  f.integer("dspark_noise_token_id", c.dspark_noise_token_id, 0, kMaxId);
  f.integers("dspark_target_layer_ids", c.dspark_target_layer_ids, 0, kMaxLayers - 1);
  f.integer("dspark_markov_rank", c.dspark_markov_rank, 1, kMaxDim);
  f.integer("dspark_n_routed_experts", c.dspark_n_routed_experts, 0, 1 << 16);
}

// --- the official inference/config.json (ModelArgs) ---------------------------------------------

Config parse_official(const json& j, const std::string& where) {
  Config c;  // ModelArgs defaults: a missing key means what it means to the reference
  Fields f(j, where);
  read_common(f, c);
  f.integer("max_batch_size", c.max_batch_size, 1, 1 << 20);
  f.integer("max_seq_len", c.max_seq_len, 1, kMaxId);
  f.number("temperature", c.temperature, 0, 1e6);
  f.choice("dtype", c.dtype, {"bf16", "fp8"});
  f.optional_choice("expert_dtype", c.expert_dtype, {"fp4"});
  f.integer("dim", c.dim, 1, kMaxDim);
  f.integer("moe_inter_dim", c.moe_inter_dim, 1, kMaxDim);
  f.integer("n_layers", c.n_layers, 1, kMaxLayers);
  f.integer("n_mtp_layers", c.n_mtp_layers, 0, kMaxLayers);
  f.integer("n_heads", c.n_heads, 1, kMaxDim);
  f.integer("n_activated_experts", c.n_activated_experts, 1, 1 << 16);
  f.choice("score_func", c.score_func, {"softmax", "sigmoid", "sqrtsoftplus"});
  f.number("route_scale", c.route_scale, 0, 1e6);
  f.integer("rope_head_dim", c.rope_head_dim, 0, kMaxDim);
  f.number("norm_eps", c.norm_eps, 0, 1);
  f.integer("window_size", c.window_size, 1, kMaxId);
  f.integers("kv_source_layers", c.kv_source_layers, 0, kMaxLayers - 1);
  f.integers("index_source_layers", c.index_source_layers, 0, kMaxLayers - 1);
  f.integer("original_seq_len", c.original_seq_len, 0, kMaxId);
  f.number("rope_factor", c.rope_factor, 1, 1e6);
  f.integer("beta_fast", c.beta_fast, 0, 1 << 20);
  f.integer("beta_slow", c.beta_slow, 0, 1 << 20);
  f.integer("candidate_source_layer", c.candidate_source_layer, -1, kMaxLayers - 1);
  f.integer("dspark_n_activated_experts", c.dspark_n_activated_experts, 0, 1 << 16);
  f.integer("vision_n_layers", c.vision.n_layers, 0, kMaxLayers);
  f.integer("vision_dim", c.vision.dim, 1, kMaxDim);
  f.integer("vision_n_heads", c.vision.n_heads, 1, kMaxDim);
  f.integer("vision_inter_dim", c.vision.inter_dim, 1, kMaxDim);
  f.integer("vision_patch_size", c.vision.patch_size, 1, 1024);
  f.number("vision_rope_theta", c.vision.rope_theta, 1, 1e12);
  f.integer("vision_downsample_ratio", c.vision.downsample_ratio, 1, 64);
  f.integer("vision_max_n_token", c.vision.max_n_token, 1, kMaxId);
  f.integer("vision_min_pixels", c.vision.min_pixels, 1, kMaxId);
  f.optional_integer("vision_max_wh_ratio", c.vision.max_wh_ratio, 1, 1 << 20);
  f.finish();
  return c;
}

// --- the Hugging Face config.json ---------------------------------------------------------------

// The released schedule, used by HF when a key is absent (configuration_deepseek_v41.py).
const std::vector<int> kReleasedKvSources = {2, 8, 14, 20};
const std::vector<int> kReleasedIndexSources = {2, 8, 14, 20, 24, 28, 32, 36};

std::vector<int> released_ratios(int n_layers) {
  std::vector<int> r = {0, 0};
  r.insert(r.end(), 18, 2);
  r.insert(r.end(), 20, 1);
  if (n_layers == int(r.size())) return r;
  // HF scales the released pattern: 2 SWA layers, a ratio-2 encoder, a ratio-1 decoder.
  int n_slide = std::min(2, n_layers), n_enc = std::max(0, (n_layers - n_slide + 1) / 2);
  std::vector<int> s(n_slide, 0);
  s.insert(s.end(), n_enc, 2);
  s.insert(s.end(), std::max(0, n_layers - n_slide - n_enc), 1);
  return s;
}

void read_rope_scaling(const json& rs, const std::string& where, Config& c) {
  Fields f(rs, where);
  std::string type = "default";
  f.choice(rs.contains("rope_type") ? "rope_type" : "type", type, {"yarn", "default"});
  f.ignore({"type", "rope_type"});
  if (type == "default") {
    c.original_seq_len = 0;
  } else {
    f.number("factor", c.rope_factor, 1, 1e6);
    f.integer("original_max_position_embeddings", c.original_seq_len, 1, kMaxId);
    f.integer("beta_fast", c.beta_fast, 0, 1 << 20);
    f.integer("beta_slow", c.beta_slow, 0, 1 << 20);
  }
  // V4/V4.1 never scale the softmax by YaRN's mscale (HF pins attention_factor to 1).
  f.require("attention_factor", 1.0, "the reference applies no YaRN attention scaling");
  f.ignore({"mscale", "mscale_all_dim", "rope_theta", "partial_rotary_factor"});
  f.finish();
}

void read_vision(const json& v, const std::string& where, VisionConfig& vc) {
  Fields f(v, where);
  vc.n_layers = 32;  // HF DeepseekV41VisionConfig defaults are the released tower
  f.integer("num_hidden_layers", vc.n_layers, 0, kMaxLayers);
  f.integer("hidden_size", vc.dim, 1, kMaxDim);
  f.integer("num_attention_heads", vc.n_heads, 1, kMaxDim);
  f.integer("intermediate_size", vc.inter_dim, 1, kMaxDim);
  f.integer("patch_size", vc.patch_size, 1, 1024);
  f.number("rope_theta", vc.rope_theta, 1, 1e12);
  f.integer("downsample_ratio", vc.downsample_ratio, 1, 64);
  f.integer("max_image_tokens", vc.max_n_token, 1, kMaxId);
  f.integer("min_pixels", vc.min_pixels, 1, kMaxId);
  f.optional_integer("max_wh_ratio", vc.max_wh_ratio, 1, 1 << 20);
  f.ignore({"model_type", "transformers_version", "torch_dtype", "dtype", "initializer_range"});
  f.finish();
}

void read_quantization(const json& q, const std::string& where, Config& c) {
  Fields f(q, where);
  std::string method = "fp8";
  f.choice("quant_method", method, {"fp8"});
  f.require("fmt", "e4m3", "dsv41 reads e4m3 fp8 weights");
  f.require("scale_fmt", "ue8m0", "dsv41 reads power-of-two ue8m0 weight scales");
  f.require("weight_block_size", json::array({32, 32}), "V4.1 weights use 32x32 scale blocks");
  f.require("activation_scheme", "dynamic", "activations are quantized per 32 on the fly");
  f.optional_choice("expert_dtype", c.expert_dtype, {"fp4"});
  f.finish();
  c.dtype = "fp8";
}

Config parse_hf(const json& root, const std::string& where) {
  Config c = preset("deepseek-v4.1-flash");  // HF defaults are the released values
  c.vision = VisionConfig{};
  c.dtype = "bf16";
  c.expert_dtype.reset();
  c.original_seq_len = 0;

  Fields top(root, where);
  top.ignore({"architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "auto_map"});
  top.require("tie_word_embeddings", false, "V4.1 has a separate LM head");
  top.integer("image_token_id", c.image_token_id, 0, kMaxId);
  const json* text = top.object("text_config");
  const json* vision = top.object("vision_config");
  const json* quant = top.object("quantization_config");
  top.finish();

  const json no_text = json::object();
  Fields f(text ? *text : no_text, where + ": text_config");
  f.ignore({"model_type", "initializer_range", "use_cache", "pad_token_id", "bos_token_id", "eos_token_id",
            "output_router_logits", "router_aux_loss_coef", "router_jitter_noise", "attention_dropout",
            "layer_types", "transformers_version", "torch_dtype", "dtype"});
  f.require("num_key_value_heads", 1, "V4.1 attends with one shared KV latent");
  f.require("attention_bias", false, "V4.1 projections have no bias");
  f.require("hidden_act", "silu", "V4.1 experts use SwiGLU");
  f.require("topk_method", "noaux_tc", "V4.1 routes with the noaux_tc correction bias");
  f.require("tie_word_embeddings", false, "V4.1 has a separate LM head");
  c.compress_ratios.clear();
  read_common(f, c);
  f.integer("hidden_size", c.dim, 1, kMaxDim);
  f.integer("moe_intermediate_size", c.moe_inter_dim, 1, kMaxDim);
  f.integer("num_hidden_layers", c.n_layers, 1, kMaxLayers);
  f.integer("num_nextn_predict_layers", c.n_mtp_layers, 0, kMaxLayers);
  f.integer("num_attention_heads", c.n_heads, 1, kMaxDim);
  f.integer("num_experts_per_tok", c.n_activated_experts, 1, 1 << 16);
  f.choice("scoring_func", c.score_func, {"softmax", "sigmoid", "sqrtsoftplus"});
  f.number("routed_scaling_factor", c.route_scale, 0, 1e6);
  f.integer("qk_rope_head_dim", c.rope_head_dim, 0, kMaxDim);
  f.number("rms_norm_eps", c.norm_eps, 0, 1);
  f.integer("sliding_window", c.window_size, 1, kMaxId);
  f.integer("max_position_embeddings", c.max_seq_len, 1, kMaxId);
  f.integer("dspark_num_experts_per_tok", c.dspark_n_activated_experts, 0, 1 << 16);
  f.optional_choice("expert_dtype", c.expert_dtype, {"fp4"});
  std::optional<std::vector<int>> kv, index, targets;
  if (f.has("kv_source_layer_ids")) f.integers("kv_source_layer_ids", kv.emplace(), 0, kMaxLayers - 1);
  if (f.has("index_source_layer_ids")) f.integers("index_source_layer_ids", index.emplace(), 0, kMaxLayers - 1);
  if (!f.has("dspark_target_layer_ids")) c.dspark_target_layer_ids.clear();
  std::optional<int> candidate;
  f.optional_integer("candidate_source_layer_id", candidate, -(1 << 20), kMaxLayers - 1);
  if (const json* rs = f.object("rope_scaling")) read_rope_scaling(*rs, f.at("rope_scaling"), c);
  if (const json* rp = f.object("rope_parameters"); rp && !f.has("rope_scaling") && rp->contains("compress"))
    read_rope_scaling((*rp)["compress"], f.at("rope_parameters") + ".compress", c);
  f.finish();

  // HF's __post_init__ fills what the file leaves out; do the same so both readers agree.
  int n = c.n_layers, n_mtp = c.n_mtp_layers;
  if (c.compress_ratios.empty()) c.compress_ratios = released_ratios(n);
  if (int(c.compress_ratios.size()) >= n && int(c.compress_ratios.size()) < n + n_mtp)
    c.compress_ratios.resize(n + n_mtp, 0);  // DSpark layers are SWA-only; HF lets the file omit them
  std::vector<int> backbone(c.compress_ratios.begin(), c.compress_ratios.begin() + std::min<size_t>(n, c.compress_ratios.size()));
  if (kv) {
    c.kv_source_layers = *kv;
  } else if (backbone == released_ratios(40) && n == 40) {
    c.kv_source_layers = kReleasedKvSources;
  } else {
    c.kv_source_layers.clear();  // the first layer of each same-ratio run publishes for its run
    for (int i = 0; i < int(backbone.size()); ++i)
      if (backbone[i] > 0 && (i == 0 || backbone[i - 1] != backbone[i])) c.kv_source_layers.push_back(i);
  }
  c.index_source_layers = index ? *index : (c.kv_source_layers == kReleasedKvSources ? kReleasedIndexSources : c.kv_source_layers);
  if (candidate) c.candidate_source_layer = *candidate < 0 ? -1 : *candidate;
  else c.candidate_source_layer = c.kv_source_layers.empty() ? -1 : c.kv_source_layers.back();
  if (c.dspark_target_layer_ids.empty()) {
    for (int i = 0; i < n; ++i)
      if (!contains(c.kv_source_layers, i)) c.dspark_target_layer_ids.push_back(i);
    if (c.dspark_target_layer_ids.size() > 3)
      c.dspark_target_layer_ids.erase(c.dspark_target_layer_ids.begin(), c.dspark_target_layer_ids.end() - 3);
  }
  if (vision) read_vision(*vision, where + ": vision_config", c.vision);
  if (quant) {
    if (!c.expert_dtype) c.expert_dtype = "fp4";  // the released checkpoint's experts are fp4
    read_quantization(*quant, where + ": quantization_config", c);
  }
  return c;
}

}  // namespace

// --- validation ---------------------------------------------------------------------------------

void validate(const Config& c) {
  const std::string w = c.source.empty() ? std::string("config") : c.source;
  auto key = [&](const std::string& k) { return w + ": key '" + k + "'"; };
  auto need = [&](bool ok, const std::string& k, const std::string& expected, const std::string& found) {
    if (!ok) fail(key(k), expected, found);
  };
  auto str = [](auto x) { return std::to_string(x); };
  const int n = c.n_layers, total = c.n_total_layers();

  need(c.dtype == "fp8" || c.dtype == "bf16", "dtype", "\"fp8\" or \"bf16\"", c.dtype);
  need(!c.expert_dtype || *c.expert_dtype == "fp4", "expert_dtype", "\"fp4\" or null", c.expert_dtype.value_or(""));
  need(c.n_shared_experts == 1, "n_shared_experts", "1 (the reference has exactly one shared expert)", str(c.n_shared_experts));
  need(c.n_activated_experts <= c.n_routed_experts, "n_activated_experts",
       "at most n_routed_experts (" + str(c.n_routed_experts) + ")", str(c.n_activated_experts));
  // The weights map lists every expert's three matrices and their scales: bound the product before
  // anything builds it (1024 layers × 65,536 experts, each in range, made 2·10^8 tensor specs and
  // ran out of memory). The released model has 43 × 256.
  const int64_t expert_tensors = int64_t(total) * std::max(c.n_routed_experts, c.dspark_n_routed_experts) * 6;
  need(expert_tensors <= kMaxExpertTensors, "n_routed_experts",
       "at most " + str(kMaxExpertTensors) + " expert tensors in all (layers × experts × 6: w1, w2, w3 and their scales)",
       str(c.n_routed_experts) + " experts × " + str(total) + " layers = " + str(expert_tensors));
  need(c.rope_head_dim % 2 == 0 && c.rope_head_dim <= c.head_dim, "rope_head_dim",
       "an even number no larger than head_dim (" + str(c.head_dim) + ")", str(c.rope_head_dim));
  need(c.head_dim % 32 == 0, "head_dim", "a multiple of 32 (SWA-FP8 scales per 32, KV-FP4 per 16)", str(c.head_dim));
  need(c.n_heads % c.o_groups == 0, "o_groups", "a divisor of n_heads (" + str(c.n_heads) + ")", str(c.o_groups));
  need(c.norm_eps > 0, "norm_eps", "a positive number", std::to_string(c.norm_eps));
  if (c.fp4_experts()) {
    need(c.dim % 32 == 0, "dim", "a multiple of 32 (fp4 experts scale per 32 along K)", str(c.dim));
    need(c.moe_inter_dim % 32 == 0, "moe_inter_dim", "a multiple of 32 (fp4 experts scale per 32 along K)", str(c.moe_inter_dim));
  }

  // The layer schedule: one ratio per layer, DSpark layers included, and those are SWA-only.
  need(int(c.compress_ratios.size()) == total, "compress_ratios",
       str(total) + " entries (n_layers " + str(n) + " + n_mtp_layers " + str(c.n_mtp_layers) + ")",
       str(c.compress_ratios.size()) + " entries");
  for (int i = n; i < total; ++i)
    need(c.compress_ratios[i] == 0, "compress_ratios[" + str(i) + "]", "0 (DSpark layers attend to their window only)",
         str(c.compress_ratios[i]));
  auto check_ids = [&](const std::vector<int>& ids, const std::string& k, bool compressed) {
    for (size_t j = 0; j < ids.size(); ++j) {
      std::string kj = k + "[" + str(j) + "]";
      need(ids[j] >= 0 && ids[j] < n, kj, "a backbone layer id in [0, " + str(n) + ")", str(ids[j]));
      need(j == 0 || ids[j] > ids[j - 1], kj, "ids in increasing order, each once", show_list(ids));
      if (compressed)
        need(c.compress_ratios[ids[j]] > 0, kj, "a layer with compress_ratios > 0",
             "layer " + str(ids[j]) + " with ratio 0");
    }
  };
  check_ids(c.kv_source_layers, "kv_source_layers", true);
  check_ids(c.index_source_layers, "index_source_layers", true);
  for (int s : c.kv_source_layers)
    need(c.is_index_source(s), "index_source_layers", "every kv-source layer (it owns the index keys), including " + str(s),
         show_list(c.index_source_layers));
  for (int i = 0; i < n; ++i) {
    if (c.compress_ratios[i] == 0) continue;
    int src = c.kv_source_of(i);
    need(src >= 0, "kv_source_layers", "a kv-source at or before layer " + str(i) + " (its ratio is " + str(c.compress_ratios[i]) + ")",
         show_list(c.kv_source_layers));
    need(c.compress_ratios[src] == c.compress_ratios[i], "compress_ratios[" + str(i) + "]",
         "the ratio of its kv-source layer " + str(src) + " (" + str(c.compress_ratios[src]) + ")", str(c.compress_ratios[i]));
  }
  if (c.candidate_source_layer >= 0) {
    int cs = c.candidate_source_layer;
    need(c.is_index_source(cs), "candidate_source_layer", "one of index_source_layers " + show_list(c.index_source_layers), str(cs));
    need(c.candidate_topk_blocks >= 1, "candidate_topk_blocks", "at least 1 when a candidate source is set", str(c.candidate_topk_blocks));
    need(c.candidate_block_size >= 1, "candidate_block_size", "at least 1 when a candidate source is set", str(c.candidate_block_size));
    for (int s : c.index_source_layers)
      if (s > cs)
        need(c.kv_source_of(s) == c.kv_source_of(cs), "index_source_layers",
             "index sources after candidate source " + str(cs) + " reading its kv-source " + str(c.kv_source_of(cs)),
             "layer " + str(s) + " reading kv-source " + str(c.kv_source_of(s)));
  }
  bool any_compressed = false;
  for (int i = 0; i < n; ++i) any_compressed |= c.compress_ratios[i] > 0;
  if (any_compressed) {
    need(c.index_head_dim % 32 == 0, "index_head_dim", "a multiple of 32 (MXFP4 scales per 32)", str(c.index_head_dim));
    need(c.rope_head_dim <= c.index_head_dim, "index_head_dim", "at least rope_head_dim (" + str(c.rope_head_dim) + ")",
         str(c.index_head_dim));
  }

  // Engram: one table size per layer, and each must be the sum of that layer's primes.
  if (c.has_engram()) {
    check_ids(c.engram_layer_ids, "engram_layer_ids", false);
    need(c.engram_max_ngram_size >= 2, "engram_max_ngram_size", "at least 2 (orders 2..N are hashed)", str(c.engram_max_ngram_size));
    need(c.engram_n_heads >= 1, "engram_n_heads", "at least 1", str(c.engram_n_heads));
    need(c.engram_head_dim >= 32 && c.engram_head_dim % 32 == 0, "engram_head_dim",
         "a positive multiple of 32 (fp8 rows scale per 32)", str(c.engram_head_dim));
    need(c.engram_vocab_size >= 2, "engram_vocab_size", "at least 2", str(c.engram_vocab_size));
    need(c.engram_compressed_vocab_size >= 1 && c.engram_compressed_vocab_size <= c.vocab_size,
         "engram_compressed_vocab_size", "in [1, vocab_size " + str(c.vocab_size) + "]", str(c.engram_compressed_vocab_size));
    need(c.engram_pad_id < c.vocab_size, "engram_pad_id", "a token id below vocab_size", str(c.engram_pad_id));
    need(c.engram_num_embeddings.size() == c.engram_layer_ids.size(), "engram_num_embeddings",
         str(c.engram_layer_ids.size()) + " entries (one per engram_layer_ids)", str(c.engram_num_embeddings.size()) + " entries");
    const std::vector<int64_t> rows = engram_table_rows(c);
    need(c.engram_num_embeddings == rows, "engram_num_embeddings",
         show_list(rows) + " (sums of the primes above engram_vocab_size)", show_list(c.engram_num_embeddings));
  }

  if (c.has_dspark()) {
    need(!c.dspark_target_layer_ids.empty(), "dspark_target_layer_ids", "at least one target layer", "[]");
    for (size_t j = 0; j < c.dspark_target_layer_ids.size(); ++j)
      need(c.dspark_target_layer_ids[j] < n, "dspark_target_layer_ids[" + str(j) + "]", "a backbone layer id below " + str(n),
           str(c.dspark_target_layer_ids[j]));
    need(c.dspark_noise_token_id < c.vocab_size, "dspark_noise_token_id", "a token id below vocab_size", str(c.dspark_noise_token_id));
    int routed = c.routed_experts(n), active = c.activated_experts(n);
    need(active <= routed, "dspark_n_activated_experts", "at most the draft layers' routed experts (" + str(routed) + ")", str(active));
  }
  if (c.has_vision()) {
    need(c.vision.dim % c.vision.n_heads == 0, "vision_dim", "a multiple of vision_n_heads (" + str(c.vision.n_heads) + ")",
         str(c.vision.dim));
    // The ViT's 2D RoPE turns the head's two halves by a row angle and a column angle each
    // (docs/vision.md §5): the reference's cos/sin tables only line up with a multiple of 4.
    const int head_dim = c.vision.dim / c.vision.n_heads;
    need(head_dim % 4 == 0, "vision_dim / vision_n_heads", "a multiple of 4 (the 2D RoPE's two axes of pairs)",
         str(head_dim));
  }
  need(c.image_token_id < c.vocab_size, "image_token_id", "a token id below vocab_size (" + str(c.vocab_size) + ")",
       str(c.image_token_id));
}

// --- entry points -------------------------------------------------------------------------------

Config parse_config(const std::string& text, const std::string& where) {
  const json j = parse_json(text, where);
  if (!j.is_object()) fail(where, "a JSON object", show(j));
  // The HF layout nests the text model under text_config; the official one is flat ModelArgs.
  Config c = j.contains("text_config") ? parse_hf(j, where) : parse_official(j, where);
  c.source = where;
  validate(c);
  return c;
}

Config load_config(const std::string& path) {
  std::string file = path;
  if (std::ifstream probe(path + "/config.json"); probe) file = path + "/config.json";
  std::ifstream in(file);
  if (!in) fail(file, "a readable config.json", "no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), file);
}

std::string to_official_json(const Config& c) {
  json j = json::object();
  j["max_batch_size"] = c.max_batch_size;
  j["max_seq_len"] = c.max_seq_len;
  j["temperature"] = c.temperature;
  j["dtype"] = c.dtype;
  j["expert_dtype"] = c.expert_dtype ? json(*c.expert_dtype) : json(nullptr);
  j["vocab_size"] = c.vocab_size;
  j["dim"] = c.dim;
  j["moe_inter_dim"] = c.moe_inter_dim;
  j["n_layers"] = c.n_layers;
  j["n_mtp_layers"] = c.n_mtp_layers;
  j["n_heads"] = c.n_heads;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["n_activated_experts"] = c.n_activated_experts;
  j["score_func"] = c.score_func;
  j["gate_temp"] = c.gate_temp;
  j["norm_topk_prob"] = c.norm_topk_prob;
  j["route_scale"] = c.route_scale;
  j["swiglu_limit"] = c.swiglu_limit;
  j["q_lora_rank"] = c.q_lora_rank;
  j["head_dim"] = c.head_dim;
  j["rope_head_dim"] = c.rope_head_dim;
  j["norm_eps"] = c.norm_eps;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["window_size"] = c.window_size;
  j["compress_ratios"] = c.compress_ratios;
  j["kv_source_layers"] = c.kv_source_layers;
  j["index_source_layers"] = c.index_source_layers;
  j["compress_rope_theta"] = c.compress_rope_theta;
  j["original_seq_len"] = c.original_seq_len;
  j["rope_theta"] = c.rope_theta;
  j["rope_factor"] = c.rope_factor;
  j["beta_fast"] = c.beta_fast;
  j["beta_slow"] = c.beta_slow;
  j["index_n_heads"] = c.index_n_heads;
  j["index_head_dim"] = c.index_head_dim;
  j["index_topk"] = c.index_topk;
  j["candidate_source_layer"] = c.candidate_source_layer;
  j["candidate_topk_blocks"] = c.candidate_topk_blocks;
  j["candidate_block_size"] = c.candidate_block_size;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["engram_layer_ids"] = c.engram_layer_ids;
  j["engram_num_embeddings"] = c.engram_num_embeddings;
  j["engram_max_ngram_size"] = c.engram_max_ngram_size;
  j["engram_vocab_size"] = c.engram_vocab_size;
  j["engram_n_heads"] = c.engram_n_heads;
  j["engram_head_dim"] = c.engram_head_dim;
  j["engram_pad_id"] = c.engram_pad_id;
  j["engram_compressed_vocab_size"] = c.engram_compressed_vocab_size;
  j["vision_n_layers"] = c.vision.n_layers;
  j["vision_dim"] = c.vision.dim;
  j["vision_n_heads"] = c.vision.n_heads;
  j["vision_inter_dim"] = c.vision.inter_dim;
  j["vision_patch_size"] = c.vision.patch_size;
  j["vision_rope_theta"] = c.vision.rope_theta;
  j["vision_downsample_ratio"] = c.vision.downsample_ratio;
  j["vision_max_n_token"] = c.vision.max_n_token;
  j["vision_min_pixels"] = c.vision.min_pixels;
  j["vision_max_wh_ratio"] = c.vision.max_wh_ratio ? json(*c.vision.max_wh_ratio) : json(nullptr);
  j["image_token_id"] = c.image_token_id;
  j["dspark_block_size"] = c.dspark_block_size;
  j["dspark_noise_token_id"] = c.dspark_noise_token_id;
  j["dspark_target_layer_ids"] = c.dspark_target_layer_ids;
  j["dspark_markov_rank"] = c.dspark_markov_rank;
  j["dspark_n_routed_experts"] = c.dspark_n_routed_experts;
  j["dspark_n_activated_experts"] = c.dspark_n_activated_experts;
  return j.dump(4) + "\n";
}

}  // namespace dsv41
