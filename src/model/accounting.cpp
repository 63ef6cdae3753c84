#include "model/accounting.h"

#include <algorithm>

#include "model/weights.h"
#include "numerics/codecs.h"

namespace dsv41 {

std::vector<int64_t> decode_contexts() { return {4096, 32768, 131072, 1048576}; }

namespace {

// Per backbone layer: the weights one token multiplies there (dense ones, plus the share of
// routed experts it is sent to), as parameter counts and as precision-weighted FLOPs.
struct LayerCost {
  int64_t active_params = 0;
  double linear_flops = 0;
};

struct Costs {
  std::vector<LayerCost> layers;
  int64_t head_params = 0;
  double head_flops = 0;
  int64_t kv_projection_params = 0;  // the decoder kv-source's compressor and index-key projection
  double kv_projection_flops = 0;
};

bool is_kv_projection(const std::string& name) {
  return name.find(".attn.compressor.") != std::string::npos || name.find(".attn.indexer.wk.") != std::string::npos ||
         name.find(".attn.indexer.k_norm.") != std::string::npos || name.find(".attn_norm.") != std::string::npos;
}

Costs weight_costs(const Config& c) {
  Costs costs;
  costs.layers.resize(c.n_layers);
  const int ds = c.decoder_start();
  for (const TensorSpec& t : expected_tensors(c)) {
    if (t.group == WeightGroup::DSpark || t.group == WeightGroup::Vision) continue;
    // One multiply-add (2 FLOPs) per weight element a token touches, weighted by precision.
    double flops = 2.0 * double(t.params) * flop_weight(t.compute);
    if (t.role == WeightRole::Head) {
      costs.head_params += t.params;
      costs.head_flops += flops;
    }
    if (t.layer < 0 || (t.role != WeightRole::Dense && t.role != WeightRole::RoutedExpert)) continue;
    double share = 1.0;
    if (t.role == WeightRole::RoutedExpert) share = double(c.activated_experts(t.layer)) / c.routed_experts(t.layer);
    LayerCost& l = costs.layers[t.layer];
    l.active_params += int64_t(double(t.params) * share);
    l.linear_flops += flops * share;
    if (t.layer == ds && is_kv_projection(t.name)) {
      costs.kv_projection_params += t.params;
      costs.kv_projection_flops += flops;
    }
  }
  return costs;
}

double attention_flops(const Config& c, int l, int64_t pos, int64_t window_start) {
  const int64_t visible_tokens = pos + 1;
  // Core attention: QK and PV over every attended entry, per head, in bf16 after dequantization.
  int64_t entries = std::min<int64_t>(c.window_size, visible_tokens - window_start);
  const int ratio = c.compress_ratios[l];
  int64_t compressed = ratio > 0 ? visible_tokens / ratio : 0;
  if (ratio > 0) entries += std::min<int64_t>(c.index_topk, compressed);
  double flops = 4.0 * c.n_heads * c.head_dim * double(entries);

  // Indexer: an MXFP4 q·k per head and scored entry (fp4 weight), then ReLU and the fp32 head
  // weighting. A Reindex layer behind a candidate source scores only the candidate pool.
  if (c.is_index_source(l)) {
    int64_t scored = compressed;
    int cs = c.candidate_source_layer;
    if (cs >= 0 && l > cs) scored = std::min<int64_t>(scored, int64_t(c.candidate_topk_blocks) * c.candidate_block_size);
    flops += 2.0 * c.index_n_heads * c.index_head_dim * double(scored) * flop_weight(Precision::FP4);
    flops += 2.0 * c.index_n_heads * double(scored);
  }
  return flops;
}

double layers_flops(const Config& c, const Costs& costs, int first, int last, int64_t pos, int64_t window_start = 0) {
  double flops = 0;
  for (int l = first; l < last; ++l) flops += costs.layers[l].linear_flops + attention_flops(c, l, pos, window_start);
  return flops;
}

}  // namespace

double layer_flops(const Config& c, int first, int last, int64_t pos, int64_t window_start) {
  return layers_flops(c, weight_costs(c), first, last, pos, window_start);
}

RankBytes rank_weight_bytes(const Config& c, const Partition& p) {
  RankBytes b;
  for (const TensorSpec& t : expected_tensors(c)) {
    const int64_t n = t.rank_bytes(c, p);
    switch (t.group) {
      case WeightGroup::Backbone: b.backbone += n; break;
      case WeightGroup::Engram: b.engram += n; break;
      case WeightGroup::DSpark: b.dspark += n; break;
      case WeightGroup::Vision: b.vision += n; break;
    }
  }
  return b;
}

Accounting account(const Config& c, int64_t prompt_tokens) {
  Accounting a;
  for (const TensorSpec& t : expected_tensors(c)) {
    switch (t.group) {
      case WeightGroup::Backbone: a.params.backbone += t.params; break;
      case WeightGroup::Engram: a.params.engram += t.params; break;
      case WeightGroup::DSpark: a.params.dspark += t.params; break;
      case WeightGroup::Vision: a.params.vision += t.params; break;
    }
  }

  const Costs costs = weight_costs(c);
  const int n = c.n_layers, ds = c.decoder_start();
  for (int l = 0; l < n; ++l) {
    a.params.active_decode += costs.layers[l].active_params;
    a.params.active_prefill_exact += costs.layers[l].active_params;
    if (l < ds) a.params.active_prefill += costs.layers[l].active_params;
  }
  a.params.active_decode += costs.head_params;
  if (ds < n) a.params.active_prefill += costs.kv_projection_params;

  a.kv.main_entry_bytes = int64_t(kv_fp4::bytes(c.head_dim));
  a.kv.index_entry_bytes = int64_t(mxfp4::bytes(c.index_head_dim));
  a.kv.swa_entry_bytes = int64_t(swa_fp8::bytes(c.head_dim));
  for (int s : c.kv_source_layers)
    a.kv.global_bytes_per_token += double(a.kv.main_entry_bytes + a.kv.index_entry_bytes) / c.compress_ratios[s];
  int window_layers = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  a.kv.swa_bytes_per_sequence = int64_t(c.window_size) * a.kv.swa_entry_bytes * window_layers;

  for (int64_t ctx : decode_contexts()) a.decode.push_back({ctx, layers_flops(c, costs, 0, n, ctx - 1) + costs.head_flops});
  a.decode_ratio_1m_4k = a.decode.back().flops / a.decode.front().flops;

  // Prefill: logits are needed for the last position only, so the head runs once.
  const int64_t N = prompt_tokens;
  a.prefill.prompt_tokens = N;
  double exact = costs.head_flops, deflt = costs.head_flops;
  const int64_t replay_start = N - std::min<int64_t>(c.window_size, N);
  for (int64_t pos = 0; pos < N; ++pos) {
    double encoder = layers_flops(c, costs, 0, ds, pos);
    exact += encoder + layers_flops(c, costs, ds, n, pos);
    deflt += encoder;
    if (ds < n) deflt += costs.kv_projection_flops;
    if (pos >= replay_start) deflt += layers_flops(c, costs, ds, n, pos, replay_start);
  }
  a.prefill.exact_flops = exact;
  a.prefill.default_flops = ds < n ? deflt : exact;
  return a;
}

}  // namespace dsv41
