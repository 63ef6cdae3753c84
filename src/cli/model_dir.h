#pragma once
// What the commands that run a model load from its directory: the weights, the tokenizer when
// there is one, and the ids that end a reply.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/executors.h"
#include "forward/model.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41::cli {

struct ModelDir {
  std::string dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<Executor> executor;  // what the model runs on (--device)
  std::optional<Tokenizer> tokenizer;  // tokenizer.json, if present
  std::vector<int> stop_ids;           // tokenizer_config.json's eos_token, if the tokenizer knows it
  const Tokenizer* tokenizer_or_null() const { return tokenizer ? &*tokenizer : nullptr; }
};

// `random_weights` (a seed): the CUDA executor fills the weights on the device (make_executor),
// for a checkpoint that holds only the tensor layout.
// `ranks`: the model cut over that many ranks (make_executor).
ModelDir load_model_dir(const std::string& dir, Device device = Device::Auto,
                        std::optional<uint64_t> random_weights = std::nullopt, int ranks = 1);

// The checkpoint a benchmark runs: `model` when given, else a random quantized checkpoint of
// `preset` (seeded) written into a scratch directory of the process, which this object removes;
// `command` names the benchmark in the line it prints to stderr unless `quiet`. With `layout_only`
// the preset's tensor layout without values (seconds at any size; load it with random_weights). The
// scratch directory is there for the command's other files too.
class BenchCheckpoint {
 public:
  BenchCheckpoint(const std::string& command, const std::string& model, const std::string& preset, uint64_t seed, bool quiet,
                  bool layout_only = false);
  ~BenchCheckpoint() { std::filesystem::remove_all(scratch_); }
  BenchCheckpoint(const BenchCheckpoint&) = delete;
  BenchCheckpoint& operator=(const BenchCheckpoint&) = delete;
  const std::string& dir() const { return dir_; }
  const std::filesystem::path& scratch() const { return scratch_; }

 private:
  std::filesystem::path scratch_;
  std::string dir_;
};

}  // namespace dsv41::cli
