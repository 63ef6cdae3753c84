#pragma once
// `dsv41 init-random`: a checkpoint in the official layout (config.json + safetensors under the
// official names) filled with seeded random weights, scaled so activations stay finite. Tests and
// benchmarks run on these; the arithmetic is real, the values are not trained.
#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  bool quantized = false;  // fp8 dense weights (32x32 ue8m0) and fp4 experts; else all bf16
  // A directory holding a Hugging Face tokenizer.json and tokenizer_config.json, copied into the
  // checkpoint byte for byte; empty: the random tokenizer (random_tokenizer.h) of vocab_size ids.
  std::string tokenizer_dir;
  size_t max_shard_bytes = size_t(4) << 30;
  std::function<void(int64_t done_bytes, int64_t total_bytes)> progress;
};

// The config as written: `config` with dtype / expert_dtype set by `quantized`, and Engram's
// compressed vocabulary size that of `tokenizer`, the one written beside it. The tokenizer must fit
// the config: at most vocab_size ids (the ids above it are never-emitted padding rows of embed and
// head, as DeepSeek pads the V3 tokenizer's 128815 ids to 129280), and Engram's pad id one of its ids.
Config random_checkpoint_config(const Config& config, bool quantized, const Tokenizer& tokenizer);
// The same with the random tokenizer of config.vocab_size ids.
Config random_checkpoint_config(const Config& config, bool quantized);

// The tokenizer files a checkpoint ships, as read from `dir` (tokenizer.json must parse as a
// tokenizer, tokenizer_config.json as a JSON object), or the random tokenizer's when `dir` is empty.
struct TokenizerFiles {
  std::string tokenizer_json, tokenizer_config_json;
  Tokenizer tokenizer;
};
TokenizerFiles checkpoint_tokenizer(const Config& config, const std::string& dir);

// Writes DIR/model*.safetensors, DIR/tokenizer.json + tokenizer_config.json (options.tokenizer_dir's
// or the random tokenizer's) and DIR/config.json (official inference/config.json keys). A tokenizer
// that does not fit the config is refused before anything is written.
// Every tensor's values depend only on (seed, tensor name), not on write order or sharding.
void write_random_checkpoint(const Config& config, const std::string& dir, const RandomCheckpointOptions& options);

// The same files with a layout checkpoint (layout_checkpoint.h) in place of the weights: every
// tensor's shape and format as released (fp8 dense, fp4 experts), no values, a few kilobytes of
// disk at any size. A model to serve with random weights made on the device (`dsv41 serve
// --random-weights`), for benchmarks at sizes no disk holds. options.seed and quantized unused.
void write_layout_checkpoint_with_tokenizer(const Config& config, const std::string& dir, const RandomCheckpointOptions& options);

}  // namespace dsv41
