#include "train/optim/param_groups.h"

#include <fnmatch.h>

#include <cctype>
#include <vector>

#include "base/error.h"

namespace dsv41::optim {

namespace {

constexpr Update M = Update::Muon, A = Update::AdamW, S = Update::Sinkhorn, B = Update::ExpertBias;
constexpr RowBlocks W = RowBlocks::Whole;

// The report's §2.5 and §4.2.2: Muon for linear maps (head-wise for query and key), AdamW for the
// norms' weights (decayed) and for biases and scaling factors (not decayed), the Sinkhorn update
// for embeddings, heads and Engram tables (Engram ×5), the gate's bias by its loads.
constexpr GroupRule kRules[] = {
    // The model's own tensors.
    {false, "embed.weight", S, 1, false, W},
    {false, "head.weight", S, 1, false, W},
    {false, "norm.weight", A, 1, true, W},
    // Norms.
    {true, "attn_norm.weight", A, 1, true, W},
    {true, "ffn_norm.weight", A, 1, true, W},
    {true, "attn.q_norm.weight", A, 1, true, W},
    {true, "attn.kv_norm.weight", A, 1, true, W},
    {true, "attn.compressor.norm.weight", A, 1, true, W},
    {true, "attn.indexer.k_norm.weight", A, 1, true, W},
    // mHC: the mixes' projection is a matrix; its static biases and scales are not.
    {true, "hc_*_fn", M, 1, true, W},
    {true, "hc_*_base", A, 1, false, W},
    {true, "hc_*_scale", A, 1, false, W},
    // Attention: the queries head-wise, the single key head (MQA: K = V) as one block.
    {true, "attn.attn_sink", A, 1, false, W},
    {true, "attn.wq_a.weight", M, 1, true, W},
    {true, "attn.wq_b.weight", M, 1, true, RowBlocks::QueryHeads},
    {true, "attn.wkv.weight", M, 1, true, W},
    {true, "attn.wo_a.weight", M, 1, true, RowBlocks::OutputGroups},
    {true, "attn.wo_b.weight", M, 1, true, W},
    {true, "attn.compressor.wkv.weight", M, 1, true, W},
    {true, "attn.compressor.wgate.weight", M, 1, true, W},
    {true, "attn.indexer.wq_b.weight", M, 1, true, RowBlocks::IndexerHeads},
    {true, "attn.indexer.weights_proj.weight", M, 1, true, W},
    {true, "attn.indexer.wk.weight", M, 1, true, W},
    // MoE.
    {true, "ffn.gate.weight", M, 1, true, W},
    {true, "ffn.gate.bias", B, 1, false, W},
    {true, "ffn.gate.bias_vl", B, 1, false, W},
    {true, "ffn.experts.*.w[123].weight", M, 1, true, W},
    {true, "ffn.shared_experts.w[123].weight", M, 1, true, W},
    // Engram: the table by the Sinkhorn update at 5× the rate, the value/key projection by Muon,
    // the gate's two RMSNorm weights by AdamW.
    {true, "engram.embed.weight", S, 5, false, W},
    {true, "engram.wkv.weight", M, 1, true, W},
    {true, "engram.q_weight", A, 1, true, W},
    {true, "engram.k_weight", A, 1, true, W},
    // DSpark's own tensors (mtp.<j>.).
    {true, "main_proj.weight", M, 1, true, W},
    {true, "main_norm.weight", A, 1, true, W},
    {true, "norm.weight", A, 1, true, W},
    {true, "markov_head.embed.weight", S, 1, false, W},
    {true, "markov_head.head.weight", S, 1, false, W},
    {true, "confidence_head.proj.weight", M, 1, true, W},
};

// "layers.<i>." or "mtp.<j>.": the length of the prefix, 0 if `name` has none.
size_t block_prefix(const std::string& name) {
  for (const char* p : {"layers.", "mtp."}) {
    const size_t n = std::char_traits<char>::length(p);
    if (name.compare(0, n, p) != 0) continue;
    size_t i = n;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    if (i > n && i < name.size() && name[i] == '.') return i + 1;
  }
  return 0;
}

int64_t row_blocks(const Config& c, RowBlocks blocks) {
  switch (blocks) {
    case RowBlocks::Whole: return 1;
    case RowBlocks::QueryHeads: return c.n_heads;
    case RowBlocks::IndexerHeads: return c.index_n_heads;
    case RowBlocks::OutputGroups: return c.o_groups;
  }
  return 1;
}

}  // namespace

const char* update_name(Update update) {
  switch (update) {
    case Update::Muon: return "Muon";
    case Update::AdamW: return "AdamW";
    case Update::Sinkhorn: return "Sinkhorn";
    case Update::ExpertBias: return "expert bias";
  }
  return "?";
}

std::span<const GroupRule> group_rules() { return kRules; }

ParamGroup param_group(const Config& config, const std::string& name) {
  const size_t prefix = block_prefix(name);
  const std::string local = name.substr(prefix);
  std::vector<const GroupRule*> matches;
  for (const GroupRule& rule : kRules)
    if (rule.in_block == (prefix > 0) && fnmatch(rule.pattern, local.c_str(), 0) == 0) matches.push_back(&rule);
  if (matches.size() != 1) {
    std::string found = matches.empty() ? "no row" : std::to_string(matches.size()) + " rows:";
    for (const GroupRule* r : matches) found += std::string(" '") + r->pattern + "'";
    fail("parameter groups, tensor '" + name + "'", "exactly one row of the table (docs/training.md)", found);
  }
  const GroupRule& r = *matches.front();
  return {r.update, r.lr_multiplier, r.weight_decay, row_blocks(config, r.blocks), &r};
}

}  // namespace dsv41::optim
