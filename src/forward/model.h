#pragma once
// A loaded V4.1 checkpoint: the config, the mapped tensors, and per-layer views of every weight
// under the names of model.py, checked against the weights map before anything is bound.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/rope.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/gate.h"
#include "model/weight.h"

namespace dsv41 {

struct ExpertWeights {
  Weight w1, w2, w3;
};

struct AttentionWeights {
  Weight wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  // kv-source layers: the compressor (wgate only at ratio > 1)
  Weight compressor_wkv, compressor_wgate, compressor_norm;
  // index-source layers: the indexer query; kv-sources also own the index-key projection
  Weight indexer_wq_b, indexer_weights_proj, indexer_wk, indexer_k_norm;
};

struct EngramWeights {
  const uint8_t* table = nullptr;         // [rows, head_dim] e4m3
  const uint8_t* table_scale = nullptr;   // [rows, head_dim / 32] ue8m0
  Weight wkv;
  std::vector<float> qk;                  // q_weight ⊙ k_weight [hc, dim], fp32
};

struct LayerWeights {
  int id = 0;
  Weight attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  Weight gate, gate_bias;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  std::unique_ptr<EngramWeights> engram;  // layers in engram_layer_ids
};

class Model {
 public:
  // Opens DIR (config.json + safetensors), checks every tensor against the config, binds views.
  static std::unique_ptr<Model> load(const std::string& dir);

  const Config& config() const { return config_; }
  const Weight& embed() const { return embed_; }
  const Weight& norm() const { return norm_; }
  const Weight& head() const { return head_; }
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }
  // The layer's RoPE: base theta without YaRN on SWA-only layers; compress theta with YaRN otherwise.
  const RopeTable& rope(int layer) const;

 private:
  Model(Config config, Checkpoint ckpt);
  Weight get(const std::string& name) const;
  Weight get_linear(const std::string& name) const;
  void bind_layer(LayerWeights& l, int id);

  Config config_;
  Checkpoint ckpt_;
  Weight embed_, norm_, head_;
  std::vector<LayerWeights> layers_;
  RopeTable rope_window_, rope_compressed_;
  std::vector<std::vector<uint8_t>> owned_;  // wo_a dequantized to bf16, as convert.py does
};

}  // namespace dsv41
