#pragma once
// The trained model in the official checkpoint layout (docs/checkpoint.md), as `dsv41 serve`,
// `generate` and `chat` load it unchanged: config.json, model*.safetensors under the weights map's
// names (model/weights.h) and the tokenizer's two files. Each fp32 master is stored in its tensor's
// released format: fp8 e4m3 with a ue8m0 scale per 32 × 32 block (the linears of an "fp8" config),
// fp4 e2m1 with a ue8m0 scale per 32 along a row (the routed experts of an "fp4" expert_dtype), the
// Engram table as e4m3 rows with a ue8m0 scale per 32, bf16 or fp32 as the map says. The numerics
// layer's quantizers (numerics/codecs.h) produce the bytes, the same that write the random
// checkpoints; loading dequantizes to exactly those values.
#include <cstddef>
#include <string>

#include "model/config.h"
#include "train/model/parameters.h"

namespace dsv41::train {

struct ReleaseFiles {
  std::string tokenizer_json, tokenizer_config_json;  // copied byte for byte
  size_t max_shard_bytes = size_t(4) << 30;
};

// Writes the checkpoint of `params` (whose config is written as config.json, last: a directory with a
// config is complete) into `dir`, which must not hold a checkpoint yet.
void write_release_checkpoint(const Parameters<float>& params, const std::string& dir, const ReleaseFiles& files);

}  // namespace dsv41::train
