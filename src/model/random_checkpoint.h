#pragma once
// `dsv41 init-random`: a checkpoint in the official layout (config.json + safetensors under the
// official names) filled with seeded random weights, scaled so activations stay finite. Tests and
// benchmarks run on these; the arithmetic is real, the values are not trained.
#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"

namespace dsv41 {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  bool quantized = false;  // fp8 dense weights (32x32 ue8m0) and fp4 experts; else all bf16
  size_t max_shard_bytes = size_t(4) << 30;
  std::function<void(int64_t done_bytes, int64_t total_bytes)> progress;
};

// The config as written: `config` with dtype / expert_dtype set by `quantized`, and Engram's
// compressed vocabulary size that of the random tokenizer written beside it.
Config random_checkpoint_config(const Config& config, bool quantized);

// Writes DIR/model*.safetensors, DIR/tokenizer.json + tokenizer_config.json (random_tokenizer.h)
// and DIR/config.json (official inference/config.json keys).
// Every tensor's values depend only on (seed, tensor name), not on write order or sharding.
void write_random_checkpoint(const Config& config, const std::string& dir, const RandomCheckpointOptions& options);

}  // namespace dsv41
