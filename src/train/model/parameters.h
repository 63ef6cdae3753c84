#pragma once
// The trainer's parameters (docs/training.md, "The model"): one fp32 master tensor (T = float; double
// for the gradient checks) per tensor of the official weights map, under its checkpoint name, with
// its gradient buffer beside it. A quantized tensor is one parameter in its logical shape — an fp8
// Linear is "<name>.weight" [out, in] without its ".scale", an fp4 expert the same, the Engram table
// "engram.embed.weight" [rows, head_dim] with its per-32 scales folded in — so that a checkpoint is
// loaded by dequantizing (load_parameters) and will be written by quantizing the masters.
//
// The blocks are bound through the weights map's one table (model/layer_weights.h,
// for_each_block_tensor): LayerParams has LayerWeights' fields, each pointing at its parameter, so the
// training network (network.h's attention reads `layer(l).attn.wq_a`) and the engine read the same
// names from the same table.
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/layer_weights.h"
#include "model/weights.h"

namespace dsv41 {
class Model;
}

namespace dsv41::train {

template <class T>
struct Param {
  std::string name;             // the checkpoint's tensor name
  std::vector<int64_t> shape;   // logical shape: [out, in] for a matrix
  BlockTensor::Kind kind = BlockTensor::Kind::Plain;  // how the checkpoint stores it (Linear: the config's dtype)
  WeightRole role = WeightRole::Dense;
  WeightGroup group = WeightGroup::Backbone;
  std::vector<T> value, grad;   // the master values and their gradient, row-major

  int64_t numel() const { return int64_t(value.size()); }
  T* v() { return value.data(); }
  T* g() { return grad.data(); }
};

template <class T>
struct HcParams {
  Param<T>* fn = nullptr;     // [(2 + hc) hc, hc dim]
  Param<T>* base = nullptr;   // [(2 + hc) hc]
  Param<T>* scale = nullptr;  // [3]
};

template <class T>
struct AttentionParams {
  Param<T>*wq_a = nullptr, *q_norm = nullptr, *wq_b = nullptr, *wkv = nullptr, *kv_norm = nullptr, *wo_a = nullptr,
  *wo_b = nullptr, *attn_sink = nullptr;
  Param<T>*compressor_wkv = nullptr, *compressor_wgate = nullptr, *compressor_norm = nullptr;
  Param<T>*indexer_wq_b = nullptr, *indexer_weights_proj = nullptr, *indexer_wk = nullptr, *indexer_k_norm = nullptr;
};

template <class T>
struct ExpertParams {
  Param<T>*w1 = nullptr, *w2 = nullptr, *w3 = nullptr;
};

template <class T>
struct EngramParams {
  Param<T>* table = nullptr;        // [rows, head_dim], the dequantized rows
  Param<T>* table_scale = nullptr;  // always null: the scales are folded into the table
  Param<T>* wkv = nullptr;
  Param<T>*q_weight = nullptr, *k_weight = nullptr;
};

// One block's parameters, with LayerWeights' field names (for_each_block_tensor binds both).
template <class T>
struct LayerParams {
  Param<T>*attn_norm = nullptr, *ffn_norm = nullptr;
  HcParams<T> hc_attn, hc_ffn;
  AttentionParams<T> attn;
  Param<T>*gate = nullptr, *gate_bias = nullptr, *gate_bias_vl = nullptr;
  std::vector<ExpertParams<T>> experts;
  ExpertParams<T> shared;
  std::unique_ptr<EngramParams<T>> engram;
};

template <class T>
struct DSparkParams {
  Param<T>*main_proj = nullptr, *main_norm = nullptr, *norm = nullptr, *markov_embed = nullptr, *markov_head = nullptr,
  *confidence = nullptr;
};

// Every parameter of a Config's model, zero until initialised or loaded. Movable, not copyable (the
// blocks point at the tensors).
template <class T>
class Parameters {
 public:
  // Throws dsv41::Error for a config with a vision tower (not implemented in training).
  explicit Parameters(const Config& config);
  Parameters(Parameters&&) = default;
  Parameters& operator=(Parameters&&) = default;

  const Config& config() const { return config_; }
  // Every tensor, in the weights map's order (expected_tensors without the scales).
  std::deque<Param<T>>& all() { return all_; }
  const std::deque<Param<T>>& all() const { return all_; }
  // The tensor `name`; throws dsv41::Error naming it when there is none.
  Param<T>& at(const std::string& name);
  const Param<T>& at(const std::string& name) const;

  Param<T>& embed() { return *embed_; }
  Param<T>& norm() { return *norm_; }
  Param<T>& head() { return *head_; }
  // Block i: backbone layer i < n_layers, DSpark stage i − n_layers (mtp.<j>).
  LayerParams<T>& layer(int i) { return layers_[size_t(i)]; }
  const LayerParams<T>& layer(int i) const { return layers_[size_t(i)]; }
  int blocks() const { return int(layers_.size()); }
  DSparkParams<T>& dspark() { return dspark_; }

  void zero_grad();
  int64_t count() const;  // logical elements of all tensors

  // The values of `other` (same config), converted to T: the float model's masters as the double check's.
  template <class U>
  void copy_values(const Parameters<U>& other) {
    for (const Param<U>& p : other.all()) {
      Param<T>& mine = at(p.name);
      mine.value.assign(p.value.begin(), p.value.end());
    }
  }

 private:
  Param<T>& add(const BlockTensor& t);

  Config config_;
  std::deque<Param<T>> all_;
  std::map<std::string, Param<T>*> by_name_;
  Param<T>*embed_ = nullptr, *norm_ = nullptr, *head_ = nullptr;
  std::vector<LayerParams<T>> layers_;
  DSparkParams<T> dspark_;
};

// The random initialisation (docs/training.md, "The model"): DeepSeek-V3's N(0, 0.006) for every
// matrix, embedding and table (the V4 reports publish none); RMSNorm weights and Engram's q/k weights
// 1; mHC as its paper starts it (hc_fn 0, α = hc_scale 0.01) with biases giving pre = 1/hc, post = 1
// and comb near the identity; the gate's bias and the attention sinks 0. Each tensor's values depend on
// (seed, name) only.
struct InitOptions {
  uint64_t seed = 0;
  double stddev = 0.006;
  double hc_scale = 0.01;
  double comb_diagonal = 4.0;  // comb's base on the diagonal (0 elsewhere): softmax rows of 0.95 on it
};
template <class T>
void init_parameters(Parameters<T>& params, const InitOptions& options);

// The masters from a loaded checkpoint of the same config: every tensor dequantized (fp8 blocks, fp4
// experts, bf16, fp32) to its exact value. Throws dsv41::Error when the configs differ in shape.
template <class T>
void load_parameters(Parameters<T>& params, const Model& model);

}  // namespace dsv41::train
