#include "cli/model_dir.h"

#include <fmt/core.h>
#include <unistd.h>

#include <filesystem>

#include "cli/progress.h"
#include "model/random_checkpoint.h"

namespace dsv41::cli {

ModelDir load_model_dir(const std::string& dir, Device device, std::optional<uint64_t> random_weights, int ranks) {
  ModelDir m;
  m.dir = dir;
  check_device(device);
  // Its steps, each timed while it runs: none reports its own progress (placing the weights on a
  // device takes minutes for the released model).
  Progress progress(stderr_is_terminal(), /*elapsed=*/true);
  progress.update("loading " + dir + ": the checkpoint", 0, 3);
  m.model = Model::load(dir);
  progress.update("loading " + dir + ": the weights to the executor", 1, 3);
  m.executor = make_executor(*m.model, device, random_weights, ranks);
  progress.update("loading " + dir + ": the tokenizer", 2, 3);
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    m.tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
    if (std::optional<int> eos = config_eos_id(dir, *m.tokenizer)) m.stop_ids.push_back(*eos);
  }
  return m;
}

BenchCheckpoint::BenchCheckpoint(const std::string& command, const std::string& model, const std::string& preset_name,
                                 uint64_t seed, bool quiet, bool layout_only)
    : scratch_(std::filesystem::temp_directory_path() / fmt::format("dsv41-bench-{}-{}", command, ::getpid())), dir_(model) {
  std::filesystem::remove_all(scratch_);
  std::filesystem::create_directories(scratch_);
  if (!dir_.empty()) return;
  dir_ = (scratch_ / "model").string();
  if (!quiet) fmt::print(stderr, "bench {}: writing a {} {} checkpoint to {}\n", command, layout_only ? "layout-only" : "random", preset_name, dir_);
  RandomCheckpointOptions o;
  o.seed = seed;
  o.quantized = true;
  if (layout_only) {
    write_layout_checkpoint_with_tokenizer(preset(preset_name), dir_, o);
    return;
  }
  Progress progress(stderr_is_terminal() && !quiet);
  o.progress = [&](int64_t done, int64_t total) { progress.update("writing " + dir_, done, total, Progress::Unit::Bytes); };
  write_random_checkpoint(preset(preset_name), dir_, o);
}

}  // namespace dsv41::cli
