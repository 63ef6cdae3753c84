#pragma once
// The configuration of `dsv41 train` (docs/training.md, "dsv41 train"): a JSON object holding the
// model — a preset name, a preset with official config.json keys changed, or a whole config as
// `dsv41` reads config.json — the data directory of `dsv41 data build`, and the training
// hyper-parameters (sequence length, batch, steps, the optimizers and schedule of src/train/optim,
// the seed, the intervals of logging, validation and checkpoints). Every key is type- and
// range-checked and an unknown key is refused by name, as the model's config is.
#include <cstdint>
#include <string>

#include "model/config.h"
#include "train/model/train_model.h"
#include "train/optim/expert_bias.h"
#include "train/optim/optimizer.h"

namespace dsv41::train {

struct TrainConfig {
  std::string source;  // where it was read from (messages)

  Config model;
  std::string data_dir;  // train.tokens, validation.tokens, tokenizer.json, tokenizer_config.json
  std::string out_dir;   // empty until given by the file or --out

  int64_t seq_len = 256;    // inputs per sequence (each sequence reads seq_len + 1 tokens)
  int64_t batch_size = 8;   // sequences per step
  int64_t steps = 1000;     // the run's total: the step after which it stops
  uint64_t seed = 0;        // the initialisation and the order of the train sequences
  double init_std = 0.006;  // InitOptions::stddev

  optim::OptimizerOptions optimizer;  // schedule, muon, adamw, sinkhorn
  double expert_bias_rate = optim::kExpertBiasRate;
  double indexer_loss_weight = 1.0;  // of L_indexer beside L_lm (train_model.h)
  // DSpark (docs/training.md, "DSpark"): the weight of its loss beside L_lm and the draft blocks a
  // sequence trains it on. It trains when the model has DSpark stages and both are positive.
  double dspark_loss_weight = 1.0;
  int64_t dspark_blocks = 16;
  bool trains_dspark() const { return model.has_dspark() && dspark_loss_weight > 0 && dspark_blocks > 0; }
  TrainOptions qat;
  // Decoder bounded replay simulated in training (docs/training.md, "Bounded replay in training"):
  // each train sequence served as `replay_turns` default-mode turns (replay_calls); 0: exact mode.
  // With DSpark trained, its anchors are drawn among the decoded rows (dspark_anchors).
  int64_t replay_turns = 0;

  int64_t log_interval = 10;          // a log line every this many steps
  int64_t validation_interval = 100;  // validation loss every this many steps; 0: never
  int64_t validation_tokens = 65536;  // the validation split's first ceil(this / seq_len) sequences
  int64_t checkpoint_interval = 1000; // a checkpoint every this many steps; 0: only the run's last
  int64_t keep_checkpoints = 0;       // the newest this many are kept; 0: all
};

// Parses the configuration's JSON text. `where` names it in messages; relative paths ("data",
// "out") are taken from `base_dir` (the file's directory) and stored absolute. Throws dsv41::Error
// naming the key, what was expected and what was found; "out" may be left out (then `--out`
// supplies it).
TrainConfig parse_train_config(const std::string& text, const std::string& where, const std::string& base_dir);
// Reads the file `path` (relative paths in it are taken from its directory).
TrainConfig load_train_config(const std::string& path);
// The configuration as JSON that parse_train_config reads back to the same values: every key,
// the model as an official config.json object, the paths absolute.
std::string train_config_json(const TrainConfig& config);

}  // namespace dsv41::train
