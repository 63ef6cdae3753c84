#pragma once
// The parameter-group table: which update each tensor of the weights map (model/weights.h, the
// official names) gets, its learning-rate multiplier, whether weight decay applies, and how Muon
// splits it into blocks. One table (param_groups.cpp), documented in docs/training.md,
// "Parameter groups"; every tensor of a text model's weights map matches exactly one row.
//
// Names of a block's tensors are matched without their "layers.<i>." or "mtp.<j>." prefix; the
// model's own tensors (embed, norm, head) with the whole name. Quantization scales ("….scale")
// are not parameters; the vision tower has no rows (the trained models are text models).
#include <cstdint>
#include <span>
#include <string>

#include "model/config.h"

namespace dsv41::optim {

enum class Update {
  Muon,        // muon.h
  AdamW,       // adamw.h
  Sinkhorn,    // sinkhorn_update.h
  ExpertBias,  // expert_bias.h: from the expert loads, not from a gradient
};
const char* update_name(Update update);

// The blocks of rows Muon orthogonalises separately (head-wise Muon).
enum class RowBlocks {
  Whole,         // the matrix as one (every other linear, and the single-head key projections)
  QueryHeads,    // n_heads blocks of head_dim rows (attn.wq_b)
  IndexerHeads,  // index_n_heads blocks of index_head_dim rows (attn.indexer.wq_b)
  OutputGroups,  // o_groups blocks of o_lora_rank rows (attn.wo_a: block-diagonal)
};

struct GroupRule {
  bool in_block;        // matched against the name inside a layers.<i>. / mtp.<j>. block
  const char* pattern;  // fnmatch pattern ('*', '?')
  Update update;
  float lr_multiplier;
  bool weight_decay;    // the optimizer's λ applies (Muon, AdamW on norms' weights)
  RowBlocks blocks;
};
std::span<const GroupRule> group_rules();

struct ParamGroup {
  Update update;
  float lr_multiplier;
  bool weight_decay;
  int64_t row_blocks;     // 1 unless head-wise or grouped
  const GroupRule* rule;  // the table's row
};

// The group of tensor `name` of a model of `config`. Throws dsv41::Error naming the tensor when
// no row, or more than one, matches.
ParamGroup param_group(const Config& config, const std::string& name);

}  // namespace dsv41::optim
