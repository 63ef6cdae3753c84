#include "forward/model.h"

#include <type_traits>

#include "base/error.h"
#include "model/weights.h"
#include "numerics/types.h"

namespace dsv41 {

RopeTable rope_table(const Config& c, bool compressed) {
  if (!compressed) return RopeTable(c.rope_head_dim, c.rope_theta, 0, c.rope_factor, c.beta_fast, c.beta_slow);
  return RopeTable(c.rope_head_dim, c.compress_rope_theta, c.original_seq_len, c.rope_factor, c.beta_fast, c.beta_slow);
}

Model::Model(Config config, Checkpoint ckpt)
    : config_(std::move(config)), ckpt_(std::move(ckpt)), rope_window_(rope_table(config_, false)),
      rope_compressed_(rope_table(config_, true)) {}

const RopeTable& Model::rope(int layer) const {
  return config_.compress_ratios[size_t(layer)] > 0 ? rope_compressed_ : rope_window_;
}

Weight Model::get(const std::string& name) const { return weight_of(ckpt_.get(name)); }

Weight Model::get_linear(const std::string& name) const {
  const TensorView& w = ckpt_.get(name + ".weight");
  return weight_of(w, ckpt_.find(name + ".scale"));
}

Weight Model::cut(const Weight& w, Shard shard) {
  const Partition& p = partition_;
  if (p.whole()) return w;
  if (shard == Shard::OutRows) {
    const int64_t n = cut_rows(w);
    return slice_rows(w, p.first(n), p.count(n));
  }
  if (shard == Shard::InCols) {
    owned_.emplace_back();
    return slice_cols(w, p.first(w.cols), p.count(w.cols), owned_.back());
  }
  return w;
}

// A table row's tensor into its field, the partition's part of it: a Weight over the mapped bytes
// (with its scales), or the bytes themselves (the Engram table and its scales, read in place). A
// routed expert another rank owns stays unbound.
template <class Field>
void Model::bind(const BlockTensor& t, Field& field, int layer) {
  if (t.shard == Shard::Expert && !partition_.owns_expert(t.expert, config_.routed_experts(layer))) return;
  if constexpr (std::is_same_v<Field, Weight>) {
    field = cut(t.kind == BlockTensor::Kind::Plain ? get(t.name) : get_linear(t.name), t.shard);
  } else {
    const TensorView& v = ckpt_.get(t.name);
    const int64_t first = t.shard == Shard::TableRows ? partition_.first(v.shape.at(0), Shard::TableRows) : 0;
    field = v.data + first * v.shape.at(1) * int64_t(dtype_size(v.dtype));
  }
}

void Model::bind_layer(LayerWeights& l, const std::string& prefix, int id) {
  const Config& c = config_;
  l.id = id;
  for_each_block_tensor(c, prefix, id, [&](const BlockTensor& t, auto& field) { bind(t, field, id); }, l);

  // wo_a is multiplied in bf16 (convert.py dequantizes it): an fp8 one is dequantized here once.
  Weight& wo_a = l.attn.wo_a;
  if (wo_a.format == WeightFormat::FP8) l.attn.wo_a_fp8 = wo_a;
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
  // Engram's query and key weights enter its score only as their product.
  if (l.engram) {
    EngramWeights& g = *l.engram;
    const int64_t rows = c.engram_num_embeddings[size_t(c.engram_index(id))];
    g.table_first = partition_.first(rows, Shard::TableRows);
    g.table_rows = partition_.count(rows, Shard::TableRows);
    g.qk.resize(size_t(c.hc_mult) * c.dim);
    std::vector<float> qr(size_t(c.dim)), kr(size_t(c.dim));
    for (int m = 0; m < c.hc_mult; ++m) {
      g.q_weight.row(m, qr.data());
      g.k_weight.row(m, kr.data());
      for (int i = 0; i < c.dim; ++i) g.qk[size_t(m) * c.dim + i] = qr[i] * kr[i];
    }
  }
}

std::unique_ptr<Model> Model::load(const std::string& dir, const Partition& partition) {
  Config config = load_config(dir);
  check_partition(config, partition);
  Checkpoint ckpt = Checkpoint::open(dir);
  check_weights(config, ckpt);
  std::unique_ptr<Model> m(new Model(std::move(config), std::move(ckpt)));
  m->partition_ = partition;
  m->embed_ = m->cut(m->get("embed.weight"), Shard::OutRows);
  m->norm_ = m->get("norm.weight");
  m->head_ = m->cut(m->get("head.weight"), Shard::OutRows);
  const Config& c = m->config_;
  const int stages = c.has_dspark() ? c.n_mtp_layers : 0;
  m->layers_.resize(size_t(c.n_layers + stages));
  for (int i = 0; i < c.n_layers; ++i) m->bind_layer(m->layers_[size_t(i)], "layers." + std::to_string(i) + ".", i);
  for (int j = 0; j < stages; ++j) {
    m->bind_layer(m->layers_[size_t(c.n_layers + j)], "mtp." + std::to_string(j) + ".", c.n_layers + j);
    for_each_dspark_tensor(c, j, [&](const BlockTensor& t, Weight& field) { m->bind(t, field, c.n_layers + j); }, m->dspark_);
  }
  if (c.has_vision()) {
    m->vision_ = bind_vision_weights(c, m->ckpt_);
    auto row = [&](const Weight& w) {
      std::vector<float> v(static_cast<size_t>(c.dim));
      w.row(0, v.data());
      return v;
    };
    m->delimiters_ = {row(m->vision_.image_start), row(m->vision_.image_newline), row(m->vision_.image_end)};
  }
  return m;
}

}  // namespace dsv41
