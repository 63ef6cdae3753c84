#pragma once
// The weights map: every tensor a V4.1 checkpoint holds for a given Config, under the official
// names of `inference/model.py` (reference notes §6), with its stored dtype and shape. The loader
// checks a checkpoint against it; init-random writes it; the accounting counts it.
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/dtype.h"
#include "model/partition.h"

namespace dsv41 {

class Checkpoint;

// Which part of the model a tensor belongs to (the report counts them apart).
enum class WeightGroup { Backbone, Engram, DSpark, Vision };
const char* weight_group_name(WeightGroup group);

// How a tensor takes part in computing one token.
enum class WeightRole {
  Dense,         // multiplied for every token that runs its layer
  RoutedExpert,  // multiplied only for tokens routed to its expert
  Head,          // the LM head: multiplied where logits are needed
  Lookup,        // rows gathered by id (embeddings, Engram tables): no multiply
  Scale,         // the block scales of a quantized tensor
};

// The precision a tensor's products are computed in, for the report's weighted FLOPs
// (Figure 2: BF16 = 1, FP8 = 0.5, FP4 = 0.25; fp32 counts as 1). A product of two formats counts
// at the wider one: fp8 activations times fp4 weights is an FP8 operation.
enum class Precision { FP32, BF16, FP8, FP4 };
double flop_weight(Precision p);

struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  WeightGroup group;
  WeightRole role;
  Precision compute;  // the precision its products are computed in
  int layer;          // the block it belongs to (mtp.j is layer n_layers + j), -1 outside blocks
  int64_t params;     // logical elements (an fp4 byte holds two); 0 for scales
  Shard shard = Shard::Whole;  // how a rank holds it (partition.h); a scale as its weight
  int expert = -1;             // a routed expert's index
  int64_t nbytes() const;
  // The bytes rank p.rank of p.world holds of it (partition.h's cut).
  int64_t rank_bytes(const Config& config, const Partition& p) const;
};

// All tensors of the checkpoint, in a stable order (globals, then layers, then mtp, then vision).
std::vector<TensorSpec> expected_tensors(const Config& config);

// Checks a checkpoint against the map: every missing, unexpected, mis-typed or mis-shaped
// tensor is named (all of them, not just the first) in one dsv41::Error.
void check_weights(const Config& config, const Checkpoint& checkpoint);

}  // namespace dsv41
