#pragma once
// A loaded V4.1 checkpoint: the config, the mapped tensors, and per-layer views of every weight
// (model/layer_weights.h, bound by its table) and of the vision tower (model/vision_weights.h),
// checked against the weights map before anything is bound.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/rope.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/gate.h"
#include "model/layer_weights.h"
#include "model/partition.h"
#include "model/vision_weights.h"
#include "model/weight.h"

namespace dsv41 {

// A layer's RoPE (model.py precompute_freqs_cis): rope_theta without YaRN on SWA-only layers;
// compress_rope_theta with YaRN (when original_seq_len > 0) on the layers with compressed KV.
RopeTable rope_table(const Config& config, bool compressed);

class Model {
 public:
  // Opens DIR (config.json + safetensors), checks every tensor against the config, binds views:
  // of the whole model, or of one rank's part of it (partition.h; check_partition first). A
  // rank's routed experts outside its own are left unbound.
  static std::unique_ptr<Model> load(const std::string& dir, const Partition& partition = {});

  const Config& config() const { return config_; }
  const std::string& dir() const { return ckpt_.dir(); }
  const Partition& partition() const { return partition_; }
  const Weight& embed() const { return embed_; }
  const Weight& norm() const { return norm_; }
  const Weight& head() const { return head_; }
  // Block i: a backbone layer (i < n_layers) or DSpark stage i - n_layers (mtp.<j>).
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }
  const DSparkWeights& dspark() const { return dspark_; }
  // The vision tower (a checkpoint with vision_n_layers > 0): the ViT, the aligner, and the span
  // delimiters, also as fp32 rows ([dim], bf16 values) for the rows that take them.
  bool has_vision() const { return config_.has_vision(); }
  const VisionWeights& vision() const { return vision_; }
  struct ImageDelimiters {
    std::vector<float> start, newline, end;
  };
  const ImageDelimiters& image_delimiters() const { return delimiters_; }
  // The layer's RoPE: base theta without YaRN on SWA-only layers; compress theta with YaRN otherwise.
  const RopeTable& rope(int layer) const;

 private:
  Model(Config config, Checkpoint ckpt);
  Weight get(const std::string& name) const;
  Weight get_linear(const std::string& name) const;
  Weight cut(const Weight& w, Shard shard);  // the partition's slice
  template <class Field>
  void bind(const BlockTensor& t, Field& field, int layer);
  void bind_layer(LayerWeights& l, const std::string& prefix, int id);

  Config config_;
  Checkpoint ckpt_;
  Partition partition_;
  Weight embed_, norm_, head_;
  std::vector<LayerWeights> layers_;  // the backbone's, then DSpark's stages
  DSparkWeights dspark_;
  VisionWeights vision_;
  ImageDelimiters delimiters_;
  RopeTable rope_window_, rope_compressed_;
  std::vector<std::vector<uint8_t>> owned_;  // wo_a dequantized to bf16, as convert.py does; a rank's column slices
};

}  // namespace dsv41
