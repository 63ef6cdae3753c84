#pragma once
// What a Config costs: parameters, active parameters per token, KV bytes, and decode / prefill
// FLOPs weighted by precision as the report's Figure 2 does. docs/accounting.md states every
// counting rule; this file is the only place they are implemented.
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/partition.h"

namespace dsv41 {

struct Accounting {
  struct Params {
    int64_t backbone = 0;  // embed, head, final norm and the n_layers blocks
    int64_t engram = 0;    // Engram tables and projections
    int64_t dspark = 0;    // the draft layers and heads (sharing embed and head with the backbone)
    int64_t vision = 0;    // ViT, aligner and image delimiters
    int64_t total() const { return backbone + engram + dspark + vision; }
    int64_t active_prefill = 0;  // per prompt token, default mode (encoder + decoder KV projection)
    int64_t active_prefill_exact = 0;  // per prompt token, exact mode (every layer)
    int64_t active_decode = 0;   // per generated token
  } params;

  struct Kv {
    double global_bytes_per_token = 0;  // Σ over kv-source layers of (main + index key entry) / ratio
    int64_t swa_bytes_per_sequence = 0;  // window ring of every layer, DSpark layers included
    int64_t main_entry_bytes = 0;        // one KV-FP4 entry of head_dim
    int64_t index_entry_bytes = 0;       // one MXFP4 index key of index_head_dim
    int64_t swa_entry_bytes = 0;         // one SWA-FP8 entry of head_dim
  } kv;

  struct DecodePoint {
    int64_t context;
    double flops;  // weighted, for one generated token at this context
  };
  std::vector<DecodePoint> decode;  // at 4K, 32K, 128K, 1M
  double decode_ratio_1m_4k = 0;

  struct Prefill {
    int64_t prompt_tokens = 0;
    double exact_flops = 0;    // weighted, whole prompt, every layer on every position
    double default_flops = 0;  // weighted, whole prompt, decoder bounded replay
    double default_over_exact() const { return default_flops / exact_flops; }
  } prefill;
};

// The weights' bytes one rank holds (model/partition.h: model.py's cut over `world` ranks; the
// whole model for world 1), by group: what each GPU of a several-GPU run must hold
// (docs/parallel.md). check_partition first.
struct RankBytes {
  int64_t backbone = 0, engram = 0, dspark = 0, vision = 0;
  int64_t total() const { return backbone + engram + dspark + vision; }
};
RankBytes rank_weight_bytes(const Config& config, const Partition& partition);

// The contexts the decode FLOPs are reported at.
std::vector<int64_t> decode_contexts();

Accounting account(const Config& config, int64_t prompt_tokens = 32768);

// Weighted FLOPs of running the backbone layers [first, last) for one query at 0-based position
// `pos` (so pos + 1 tokens are visible), with its sliding window starting no earlier than
// `window_start` (bounded replay truncates it there).
double layer_flops(const Config& config, int first, int last, int64_t pos, int64_t window_start = 0);

}  // namespace dsv41
