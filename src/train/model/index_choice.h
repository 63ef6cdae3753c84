#pragma once
// An index source's choice of compressed entries for each row in training (docs/training.md, "The
// indexer's gradient"), shared by the CPU trainer's op set (train_ops.h) and the CUDA trainer's
// (src/train/cuda/model): whichever computed the scores, the rows choose alike — the engine's own
// selection functions (backend/cpu/indexer.h) on the row's scores of every entry, or a trace's
// imposed choice after its checks.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cpu/indexer.h"
#include "base/error.h"
#include "forward/forward.h"
#include "model/config.h"

namespace dsv41::train {

// The trace's imposed top-k of index source l (nullptr: none), checked to have a row for each of
// the `rows`.
inline const std::vector<std::vector<int64_t>>* imposed_topk(const Trace* trace, int l, int64_t rows) {
  if (!trace || !trace->forced_topk || !trace->forced_topk->count(l)) return nullptr;
  const std::vector<std::vector<int64_t>>* imposed = &trace->forced_topk->at(l);
  if (int64_t(imposed->size()) != rows)
    fail("train forward", "imposed top-k of layer " + std::to_string(l) + " for " + std::to_string(rows) + " rows",
         std::to_string(imposed->size()));
  return imposed;
}

// Row r's top-k at index source l from its scores of every one of the n entries (`scores`,
// overwritten: the entries it does not see, the first `visible`, masked to −inf). The candidate
// source writes the row's pool into candidates[r]; a later index source keeps to it. Entries picked
// though not visible (fewer visible than k) become empty slots (−1, sorted last). With `imposed`,
// its row instead: any number of slots, the same in every row (the reference pads its top-k with
// −1 to index_topk where fewer entries exist), each visible or −1.
inline std::vector<int64_t> choose_index_row(const Config& c, int l, int64_t r, float* scores, int64_t n, int64_t visible,
                                             int64_t k, std::vector<std::vector<uint8_t>>& candidates,
                                             const std::vector<std::vector<int64_t>>* imposed) {
  for (int64_t t = visible; t < n; ++t) scores[t] = -INFINITY;
  if (l == c.candidate_source_layer) {
    candidates[size_t(r)] = candidate_mask(scores, n, visible, c.candidate_topk_blocks, c.candidate_block_size);
  } else if (c.candidate_source_layer >= 0 && l > c.candidate_source_layer) {
    for (int64_t t = 0; t < n; ++t)
      if (!candidates[size_t(r)][size_t(t)]) scores[t] = -INFINITY;
  }
  std::vector<int64_t> chosen = top_positions(scores, n, k);
  for (int64_t& t : chosen)
    if (t >= visible) t = -1;
  if (!imposed) return chosen;
  chosen = (*imposed)[size_t(r)];
  if (chosen.size() != (*imposed)[0].size())
    fail("train forward", "imposed top-k rows of one length at layer " + std::to_string(l),
         std::to_string((*imposed)[0].size()) + " and " + std::to_string(chosen.size()) + " entries");
  for (int64_t t : chosen)
    if (t < -1 || t >= std::min(visible, n))
      fail("train forward", "imposed entries visible to row " + std::to_string(r) + " or -1", std::to_string(t));
  return chosen;
}

}  // namespace dsv41::train
