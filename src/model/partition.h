#pragma once
// How a model is cut over `world` ranks (issue 24; docs/parallel.md), as model.py cuts it when
// world_size > 1: every rank runs every token; the attention's query heads, its output groups and
// the indexer's heads are split (ColumnParallelLinear: rows of wq_b, wo_a, indexer.wq_b,
// weights_proj, attn_sink), wo_b's input columns with them (RowParallelLinear), the routed experts
// by index (MoE: experts [rank·E/world, (rank+1)·E/world)), the vocabulary (ParallelEmbedding,
// ParallelHead, DSpark's Markov head) and the Engram tables' rows (ParallelEngramEmbedding:
// ceil(rows / world) a rank). Everything else is whole on every rank. The block table
// (layer_weights.h) names each tensor's Shard; the binding slices by it.
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/weight.h"

namespace dsv41 {

enum class Shard {
  Whole,      // every rank holds all of it
  OutRows,    // rows (a 1-D tensor's elements) split evenly: a column-parallel projection, a vocabulary
  InCols,     // columns split evenly: a row-parallel projection, whose products each rank sums in part
  Expert,     // a routed expert: on the rank that owns its index
  TableRows,  // an Engram table's rows: ceil(rows / world) a rank, the last rank's cut short
};

struct Partition {
  int rank = 0, world = 1;

  bool whole() const { return world == 1; }
  // The rank's part [first, first + count) of n split evenly (n % world == 0, checked by
  // check_partition) or, for TableRows, in parts of ceil(n / world).
  int64_t first(int64_t n, Shard shard = Shard::OutRows) const { return rank * part(n, shard); }
  int64_t count(int64_t n, Shard shard = Shard::OutRows) const;
  bool owns_expert(int e, int experts) const { return e / (experts / world) == rank; }

 private:
  int64_t part(int64_t n, Shard shard) const { return shard == Shard::TableRows ? (n + world - 1) / world : n / world; }
};

// Throws dsv41::Error naming the first count that `world` does not divide (query and indexer
// heads, output groups, every layer's routed experts, the vocabulary) or a rank outside [0, world).
void check_partition(const Config& config, const Partition& partition);

// The length a row cut runs along: a matrix's rows, a 1-D tensor's elements (an attention sink).
int64_t cut_rows(const Weight& w);

// The rank's slice of a weight. Rows: a view (an fp8 weight's rows cut at its 32-row scale
// blocks). Columns: a copy into `owned` (an fp8 or fp4 weight's columns cut at its 32-column
// scale blocks), which must outlive the view. dsv41::Error for a cut that splits a scale block.
Weight slice_rows(const Weight& w, int64_t first, int64_t count);
Weight slice_cols(const Weight& w, int64_t first, int64_t count, std::vector<uint8_t>& owned);

}  // namespace dsv41
