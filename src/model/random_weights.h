#pragma once
// Seeded random weights in the official layout: safetensors under the official names, values
// scaled so that activations stay finite, then config.json. The weights of `dsv41 init-random`
// (random_checkpoint.h, which adds the tokenizer's files) without the tokenizer, so that a build
// without it (the GPU machine's) can make a model of any shape for its tests.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace dsv41 {

struct RandomWeightsOptions {
  uint64_t seed = 0;
  // The ids with text: the output head's rows past them are zero (padding ids get logit 0, below a
  // real id's random logits, so greedy decoding never emits one); −1: every id of vocab_size.
  int64_t token_ids = -1;
  size_t max_shard_bytes = size_t(4) << 30;
  std::function<void(int64_t done_bytes, int64_t total_bytes)> progress;
  // Further files of the checkpoint (name, text), written after the weights and before
  // config.json, the last file: a directory with a config is complete.
  std::vector<std::pair<std::string, std::string>> files;
};

// Writes DIR/model*.safetensors (the formats config.dtype and expert_dtype say), options.files and
// DIR/config.json (official inference/config.json keys) for `config` as given, validated first.
// Every tensor's values depend only on (seed, tensor name), not on write order or sharding. A
// directory that holds a checkpoint is refused before anything is written.
void write_random_weights(const Config& config, const std::string& dir, const RandomWeightsOptions& options);

}  // namespace dsv41
