#pragma once
// The weights of one block (model.py Block: mHC, attention, MoE, and Engram where the config puts
// it) as the executors hold them, and the one table of them (for_each_block_tensor): each tensor's
// checkpoint name, dtype, shape, role and precision beside the field that holds it. The weights map
// (weights.cpp), the CPU binding (forward/model.cpp) and the device placement
// (forward/device/device_model.cu) all walk this table; a tensor added here is checked, bound and
// placed.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "model/config.h"
#include "model/dtype.h"
#include "model/partition.h"
#include "model/weight.h"
#include "model/weights.h"

namespace dsv41 {

struct ExpertWeights {
  Weight w1, w2, w3;
};

struct AttentionWeights {
  Weight wq_a, q_norm, wq_b, wkv, kv_norm, wo_a, wo_b, attn_sink;
  // wo_a as the checkpoint stores it, when that is fp8 (32 × 32 block scales): wo_a is then its
  // bf16 dequantization (convert.py's), which the CPU multiplies; the device reads these codes,
  // half the bytes, and widens them to the same bf16 values as it loads them.
  Weight wo_a_fp8;
  // kv-source layers: the compressor (wgate only at ratio > 1)
  Weight compressor_wkv, compressor_wgate, compressor_norm;
  // index-source layers: the indexer query; kv-sources also own the index-key projection
  Weight indexer_wq_b, indexer_weights_proj, indexer_wk, indexer_k_norm;
};

struct EngramWeights {
  const uint8_t* table = nullptr;        // [rows, head_dim] e4m3
  const uint8_t* table_scale = nullptr;  // [rows, head_dim / 32] ue8m0
  int64_t table_first = 0, table_rows = 0;  // the rows held: all, or a rank's part (partition.h)
  Weight wkv;
  Weight q_weight, k_weight;             // [hc, dim] bf16
  std::vector<float> qk;                 // q_weight ⊙ k_weight [hc, dim], fp32 (made by the binding)
};

struct LayerWeights {
  int id = 0;
  Weight attn_norm, ffn_norm;
  HcWeights hc_attn, hc_ffn;
  AttentionWeights attn;
  Weight gate, gate_bias, gate_bias_vl;  // gate_bias_vl: vision checkpoints only
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  std::unique_ptr<EngramWeights> engram;  // layers in engram_layer_ids
};

// DSpark's own tensors beside its blocks (model.py DSparkBlock): the context features' projection
// on the first stage, the final norm, the Markov head and the confidence head on the last.
struct DSparkWeights {
  Weight main_proj, main_norm;              // [dim, targets·dim], [dim]
  Weight norm;                              // [dim]
  Weight markov_embed, markov_head;         // [vocab, rank] bf16 each
  Weight confidence;                        // [1, dim + rank] bf16, multiplied in fp32
};

// One row of the table: a tensor of the weights map. A Linear is "<name>.weight" in the
// checkpoint's default format (fp8 with 32 × 32 ue8m0 scales in "<name>.scale", or bf16), shape
// [out, in]; an ExpertLinear the routed experts' format (fp4 when the config says so); a Plain
// tensor is `name` itself in `dtype`.
struct BlockTensor {
  enum class Kind { Plain, Linear, ExpertLinear };
  Kind kind;
  std::string name;
  DType dtype;                      // Plain
  std::vector<int64_t> shape;       // Plain: the tensor's; Linear: {out, in}
  WeightRole role = WeightRole::Dense;
  std::optional<Precision> compute;  // unset: the stored format's
  WeightGroup group = WeightGroup::Backbone;
  Shard shard = Shard::Whole;       // how model.py cuts it over ranks (partition.h)
  int expert = -1;                  // a routed expert's index (Shard::Expert)
};

namespace block_tensor {

// A layer's expert e and its Engram weights, made where the layer is being filled (a binding) and
// only read where it is const (a placement reads the host's). Any struct with the fields of
// LayerWeights may be walked (the trainer's parameters, src/train/model/parameters.h).
template <class L>
auto& expert(L& l, int e) {
  if constexpr (!std::is_const_v<L>)
    if (l.experts.size() <= size_t(e)) l.experts.resize(size_t(e) + 1);
  return l.experts[size_t(e)];
}
template <class L>
auto& engram(L& l) {
  if constexpr (!std::is_const_v<L>)
    if (!l.engram) l.engram = std::make_unique<typename decltype(l.engram)::element_type>();
  return *l.engram;
}

}  // namespace block_tensor

// Walks block `id`'s tensors (prefix p: "layers.<id>." or "mtp.<j>."), in the weights map's order,
// calling f(tensor, field of each of `layers`...): with no layers, the map alone.
template <class F, class... L>
void for_each_block_tensor(const Config& c, const std::string& p, int id, F&& f, L&... layers) {
  using K = BlockTensor::Kind;
  using block_tensor::engram;
  using block_tensor::expert;
  const int64_t dim = c.dim, hd = c.head_dim;
  const int64_t mix = int64_t(2 + c.hc_mult) * c.hc_mult, hc_dim = int64_t(c.hc_mult) * c.dim;
  auto plain = [&](const std::string& name, DType dtype, std::vector<int64_t> shape, WeightRole role = WeightRole::Dense,
                   Precision compute = Precision::BF16, WeightGroup group = WeightGroup::Backbone) {
    return BlockTensor{K::Plain, name, dtype, std::move(shape), role, compute, group};
  };
  auto norm = [&](const std::string& name, int64_t n) { return plain(name + ".weight", DType::BF16, {n}); };
  auto f32 = [&](const std::string& name, std::vector<int64_t> shape) {
    return plain(name, DType::F32, std::move(shape), WeightRole::Dense, Precision::FP32);
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in, std::optional<Precision> compute = std::nullopt,
                    WeightGroup group = WeightGroup::Backbone) {
    return BlockTensor{K::Linear, name, DType::BF16, {out, in}, WeightRole::Dense, compute, group};
  };
  auto cut = [](BlockTensor t, Shard shard) {
    t.shard = shard;
    return t;
  };
  using S = Shard;

  f(norm(p + "attn_norm", dim), layers.attn_norm...);
  f(norm(p + "ffn_norm", dim), layers.ffn_norm...);
  f(f32(p + "hc_attn_fn", {mix, hc_dim}), layers.hc_attn.fn...);
  f(f32(p + "hc_attn_base", {mix}), layers.hc_attn.base...);
  f(f32(p + "hc_attn_scale", {3}), layers.hc_attn.scale...);
  f(f32(p + "hc_ffn_fn", {mix, hc_dim}), layers.hc_ffn.fn...);
  f(f32(p + "hc_ffn_base", {mix}), layers.hc_ffn.base...);
  f(f32(p + "hc_ffn_scale", {3}), layers.hc_ffn.scale...);

  // Attention.
  const std::string a = p + "attn.";
  f(cut(f32(a + "attn_sink", {c.n_heads}), S::OutRows), layers.attn.attn_sink...);
  f(linear(a + "wq_a", c.q_lora_rank, dim), layers.attn.wq_a...);
  f(norm(a + "q_norm", c.q_lora_rank), layers.attn.q_norm...);
  f(cut(linear(a + "wq_b", int64_t(c.n_heads) * hd, c.q_lora_rank), S::OutRows), layers.attn.wq_b...);
  f(linear(a + "wkv", hd, dim), layers.attn.wkv...);
  f(norm(a + "kv_norm", hd), layers.attn.kv_norm...);
  // wo_a is block-diagonal over groups; the reference dequantizes it and multiplies in bf16.
  f(cut(linear(a + "wo_a", int64_t(c.o_groups) * c.o_lora_rank, int64_t(c.n_heads) * hd / c.o_groups, Precision::BF16),
        S::OutRows),
    layers.attn.wo_a...);
  f(cut(linear(a + "wo_b", dim, int64_t(c.o_groups) * c.o_lora_rank), S::InCols), layers.attn.wo_b...);
  if (c.is_kv_source(id)) {
    // Stored bf16; at ratio > 1 the reference pools in fp32, so it multiplies in fp32 there.
    const bool pooled = c.compress_ratios[size_t(id)] > 1;
    const Precision prec = pooled ? Precision::FP32 : Precision::BF16;
    f(plain(a + "compressor.wkv.weight", DType::BF16, {hd, dim}, WeightRole::Dense, prec), layers.attn.compressor_wkv...);
    if (pooled)
      f(plain(a + "compressor.wgate.weight", DType::BF16, {hd, dim}, WeightRole::Dense, prec),
        layers.attn.compressor_wgate...);
    f(norm(a + "compressor.norm", hd), layers.attn.compressor_norm...);
  }
  if (c.is_index_source(id)) {
    f(cut(linear(a + "indexer.wq_b", int64_t(c.index_n_heads) * c.index_head_dim, c.q_lora_rank), S::OutRows),
      layers.attn.indexer_wq_b...);
    f(cut(plain(a + "indexer.weights_proj.weight", DType::BF16, {c.index_n_heads, dim}), S::OutRows),
      layers.attn.indexer_weights_proj...);
    if (c.is_kv_source(id)) {
      f(plain(a + "indexer.wk.weight", DType::BF16, {c.index_head_dim, hd}), layers.attn.indexer_wk...);
      f(norm(a + "indexer.k_norm", c.index_head_dim), layers.attn.indexer_k_norm...);
    }
  }

  // MoE. The gate multiplies in fp32 (the reference promotes both operands).
  const std::string m = p + "ffn.";
  const int64_t inter = c.moe_inter_dim, experts = c.routed_experts(id);
  f(plain(m + "gate.weight", DType::BF16, {experts, dim}, WeightRole::Dense, Precision::FP32), layers.gate...);
  f(plain(m + "gate.bias", DType::F32, {experts}, WeightRole::Lookup, Precision::FP32), layers.gate_bias...);
  if (c.has_vision())
    f(plain(m + "gate.bias_vl", DType::F32, {experts}, WeightRole::Lookup, Precision::FP32), layers.gate_bias_vl...);
  for (int e = 0; e < int(experts); ++e) {
    const std::string ep = m + "experts." + std::to_string(e) + ".";
    auto routed = [&](const char* w, int64_t out, int64_t in) {
      return BlockTensor{K::ExpertLinear, ep + w, DType::BF16, {out, in}, WeightRole::RoutedExpert, std::nullopt,
                         WeightGroup::Backbone, S::Expert, e};
    };
    f(routed("w1", inter, dim), expert(layers, e).w1...);
    f(routed("w2", dim, inter), expert(layers, e).w2...);
    f(routed("w3", inter, dim), expert(layers, e).w3...);
  }
  f(linear(m + "shared_experts.w1", inter, dim), layers.shared.w1...);
  f(linear(m + "shared_experts.w2", dim, inter), layers.shared.w2...);
  f(linear(m + "shared_experts.w3", inter, dim), layers.shared.w3...);

  // Engram.
  const int engram_index = id < c.n_layers ? c.engram_index(id) : -1;
  if (engram_index >= 0) {
    const std::string g = p + "engram.";
    const int64_t rows = c.engram_num_embeddings[size_t(engram_index)], ehd = c.engram_head_dim;
    const WeightGroup E = WeightGroup::Engram;
    f(cut(plain(g + "embed.weight", DType::F8_E4M3, {rows, ehd}, WeightRole::Lookup, Precision::FP8, E), S::TableRows),
      engram(layers).table...);
    f(cut(plain(g + "embed.scale", DType::F8_E8M0, {rows, ehd / 32}, WeightRole::Scale, Precision::BF16, E), S::TableRows),
      engram(layers).table_scale...);
    f(linear(g + "wkv", int64_t(c.dim) * (c.hc_mult + 1), int64_t(c.engram_hash_columns()) * ehd, std::nullopt, E),
      engram(layers).wkv...);
    f(plain(g + "q_weight", DType::BF16, {c.hc_mult, c.dim}, WeightRole::Dense, Precision::FP32, E),
      engram(layers).q_weight...);
    f(plain(g + "k_weight", DType::BF16, {c.hc_mult, c.dim}, WeightRole::Dense, Precision::FP32, E),
      engram(layers).k_weight...);
  }
}

// Walks DSpark's own tensors (in the weights map after mtp.<j>'s block, j = 0 and the last),
// calling f(tensor, field of each of `heads`...), as for_each_block_tensor.
template <class F, class... D>
void for_each_dspark_tensor(const Config& c, int j, F&& f, D&... heads) {
  using K = BlockTensor::Kind;
  const std::string p = "mtp." + std::to_string(j) + ".";
  const WeightGroup G = WeightGroup::DSpark;
  auto norm = [&](const std::string& name) {
    return BlockTensor{K::Plain, name + ".weight", DType::BF16, {c.dim}, WeightRole::Dense, Precision::BF16, G};
  };
  if (j == 0) {
    f(BlockTensor{K::Linear, p + "main_proj", DType::BF16, {c.dim, int64_t(c.dim) * int64_t(c.dspark_target_layer_ids.size())},
                  WeightRole::Dense, std::nullopt, G},
      heads.main_proj...);
    f(norm(p + "main_norm"), heads.main_norm...);
  }
  if (j == c.n_mtp_layers - 1) {
    const int64_t V = c.vocab_size, r = c.dspark_markov_rank;
    f(norm(p + "norm"), heads.norm...);
    f(BlockTensor{K::Plain, p + "markov_head.embed.weight", DType::BF16, {V, r}, WeightRole::Lookup, Precision::BF16, G,
                  Shard::OutRows},
      heads.markov_embed...);
    f(BlockTensor{K::Plain, p + "markov_head.head.weight", DType::BF16, {V, r}, WeightRole::Head, Precision::FP32, G,
                  Shard::OutRows},
      heads.markov_head...);
    f(BlockTensor{K::Plain, p + "confidence_head.proj.weight", DType::BF16, {1, c.dim + r}, WeightRole::Dense,
                  Precision::FP32, G},
      heads.confidence...);
  }
}

}  // namespace dsv41
