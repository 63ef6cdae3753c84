#pragma once
// Short runs of `dsv41 train` on the small corpus (small_corpus.h), shared by the trainer's tests.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../test_util.h"
#include "small_corpus.h"
#include "train/trainer/train_config.h"

namespace dsv41::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

// One corpus per test process, shared by its tests.
inline const fs::path& corpus() {
  static test::TempDir dir("trainer_corpus");
  static const bool written = (test::write_small_corpus(dir.path()), true);
  (void)written;
  return dir.path();
}

// A short run of tiny on the corpus: 32-token sequences, two a step, every step logged.
inline json base_config(const fs::path& out, int64_t steps) {
  return {{"model", "tiny"},
          {"data", corpus().string()},
          {"out", out.string()},
          {"seq_len", 32},
          {"batch_size", 2},
          {"steps", steps},
          {"seed", 3},
          {"schedule", {{"peak_lr", 0.01}, {"warmup_steps", 3}}},
          {"log_interval", 1},
          {"validation_interval", 4},
          {"validation_tokens", 96},
          {"checkpoint_interval", 0}};
}

inline TrainConfig config_of(const json& j) { return parse_train_config(j.dump(), "test config", "/"); }

inline std::vector<json> log_of(const fs::path& out) {
  std::vector<json> events;
  std::ifstream in(out / "log.jsonl");
  for (std::string line; std::getline(in, line);) events.push_back(json::parse(line));
  return events;
}

// The train and validation events without their timings: what must repeat bit for bit.
inline std::vector<json> curve_of(const fs::path& out) {
  std::vector<json> curve;
  for (json e : log_of(out)) {
    if (e["event"] == "checkpoint") continue;
    e.erase("tokens_per_s");
    e.erase("model_tflops");
    e.erase("elapsed_s");
    e.erase("step_parts_s");
    curve.push_back(e);
  }
  return curve;
}

}  // namespace dsv41::train
