#include "forward/model.h"

#include "base/error.h"
#include "model/weights.h"
#include "numerics/types.h"

namespace dsv41 {

namespace {

RopeTable window_rope(const Config& c) {
  return RopeTable(c.rope_head_dim, c.rope_theta, 0, c.rope_factor, c.beta_fast, c.beta_slow);
}

RopeTable compressed_rope(const Config& c) {
  return RopeTable(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len, c.rope_factor, c.beta_fast, c.beta_slow);
}

}  // namespace

Model::Model(Config config, Checkpoint ckpt)
    : config_(std::move(config)), ckpt_(std::move(ckpt)), rope_window_(window_rope(config_)),
      rope_compressed_(compressed_rope(config_)) {}

const RopeTable& Model::rope(int layer) const {
  return config_.compress_ratios[size_t(layer)] > 0 ? rope_compressed_ : rope_window_;
}

Weight Model::get(const std::string& name) const { return weight_of(ckpt_.get(name)); }

Weight Model::get_linear(const std::string& name) const {
  const TensorView& w = ckpt_.get(name + ".weight");
  return weight_of(w, ckpt_.find(name + ".scale"));
}

void Model::bind_layer(LayerWeights& l, int id) {
  const Config& c = config_;
  const std::string p = "layers." + std::to_string(id) + ".";
  l.id = id;
  l.attn_norm = get(p + "attn_norm.weight");
  l.ffn_norm = get(p + "ffn_norm.weight");
  l.hc_attn = {get(p + "hc_attn_fn"), get(p + "hc_attn_base"), get(p + "hc_attn_scale")};
  l.hc_ffn = {get(p + "hc_ffn_fn"), get(p + "hc_ffn_base"), get(p + "hc_ffn_scale")};

  AttentionWeights& a = l.attn;
  const std::string ap = p + "attn.";
  a.wq_a = get_linear(ap + "wq_a");
  a.q_norm = get(ap + "q_norm.weight");
  a.wq_b = get_linear(ap + "wq_b");
  a.wkv = get_linear(ap + "wkv");
  a.kv_norm = get(ap + "kv_norm.weight");
  a.wo_b = get_linear(ap + "wo_b");
  a.attn_sink = get(ap + "attn_sink");
  // wo_a is multiplied in bf16 (convert.py dequantizes it): an fp8 one is dequantized here once.
  Weight wo_a = get_linear(ap + "wo_a");
  if (wo_a.quantized()) {
    std::vector<uint8_t> bf16(size_t(wo_a.rows * wo_a.cols * 2));
    std::vector<float> row(size_t(wo_a.cols));
    for (int64_t r = 0; r < wo_a.rows; ++r) {
      wo_a.row(r, row.data());
      for (int64_t k = 0; k < wo_a.cols; ++k) {
        uint16_t b = bf16_from_float(row[k]);
        bf16[size_t(2 * (r * wo_a.cols + k))] = uint8_t(b & 0xFF);
        bf16[size_t(2 * (r * wo_a.cols + k) + 1)] = uint8_t(b >> 8);
      }
    }
    owned_.push_back(std::move(bf16));
    wo_a = Weight{WeightFormat::BF16, wo_a.rows, wo_a.cols, owned_.back().data(), nullptr};
  }
  a.wo_a = wo_a;
  if (c.is_kv_source(id)) {
    a.compressor_wkv = get(ap + "compressor.wkv.weight");
    if (c.compress_ratios[size_t(id)] > 1) a.compressor_wgate = get(ap + "compressor.wgate.weight");
    a.compressor_norm = get(ap + "compressor.norm.weight");
  }
  if (c.is_index_source(id)) {
    a.indexer_wq_b = get_linear(ap + "indexer.wq_b");
    a.indexer_weights_proj = get(ap + "indexer.weights_proj.weight");
    if (c.is_kv_source(id)) {
      a.indexer_wk = get(ap + "indexer.wk.weight");
      a.indexer_k_norm = get(ap + "indexer.k_norm.weight");
    }
  }

  l.gate = get(p + "ffn.gate.weight");
  l.gate_bias = get(p + "ffn.gate.bias");
  for (int e = 0; e < c.routed_experts(id); ++e) {
    const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
    l.experts.push_back({get_linear(ep + "w1"), get_linear(ep + "w2"), get_linear(ep + "w3")});
  }
  l.shared = {get_linear(p + "ffn.shared_experts.w1"), get_linear(p + "ffn.shared_experts.w2"),
              get_linear(p + "ffn.shared_experts.w3")};

  for (size_t e = 0; e < c.engram_layer_ids.size(); ++e) {
    if (c.engram_layer_ids[e] != id) continue;
    auto g = std::make_unique<EngramWeights>();
    g->table = ckpt_.get(p + "engram.embed.weight").data;
    g->table_scale = ckpt_.get(p + "engram.embed.scale").data;
    g->wkv = get_linear(p + "engram.wkv");
    Weight q = get(p + "engram.q_weight"), k = get(p + "engram.k_weight");
    g->qk.resize(size_t(c.hc_mult) * c.dim);
    std::vector<float> qr(size_t(c.dim)), kr(size_t(c.dim));
    for (int m = 0; m < c.hc_mult; ++m) {
      q.row(m, qr.data());
      k.row(m, kr.data());
      for (int i = 0; i < c.dim; ++i) g->qk[size_t(m) * c.dim + i] = qr[i] * kr[i];
    }
    l.engram = std::move(g);
  }
}

std::unique_ptr<Model> Model::load(const std::string& dir) {
  Config config = load_config(dir);
  if (config.has_vision())
    fail(dir, "a text-only checkpoint (vision_n_layers 0)", "a vision tower: dsv41 does not implement images yet");
  Checkpoint ckpt = Checkpoint::open(dir);
  check_weights(config, ckpt);
  std::unique_ptr<Model> m(new Model(std::move(config), std::move(ckpt)));
  m->embed_ = m->get("embed.weight");
  m->norm_ = m->get("norm.weight");
  m->head_ = m->get("head.weight");
  m->layers_.resize(size_t(m->config_.n_layers));
  for (int i = 0; i < m->config_.n_layers; ++i) m->bind_layer(m->layers_[size_t(i)], i);
  return m;
}

}  // namespace dsv41
