#pragma once
// `dsv41 train`: the training loop over a TrainConfig (docs/training.md, "dsv41 train").
//
// A step takes batch_size sequences of the train split in the seeded order of SequenceIterator,
// runs each through the training model's forward and backward (their gradients averaged), then one
// update of the optimizer (every parameter by its group, at the schedule's rate) and the
// aux-loss-free update of each layer's gate bias from the step's expert loads. Every
// validation_interval steps the validation loss; every log_interval steps a line in log.jsonl;
// every checkpoint_interval steps, and after the run's last, a checkpoint: the model in the
// official layout (quantized as released, for `dsv41 serve`) with the fp32 masters, the optimizer's
// state and the position in the data beside it, from which `resume` continues to the same bits as
// never stopping.
//
// The output directory:
//   train_config.json               the configuration as run (every key; what resume reads)
//   log.jsonl                       one JSON object a line: train, validation and checkpoint events
//   step-NNNNNNNN/                  a checkpoint after step N (8 digits), in the official layout:
//     config.json, model.safetensors (or shards and their index), tokenizer.json, tokenizer_config.json
//     resume/masters.safetensors    the fp32 masters (masters.h)
//     resume/optimizer.state        the optimizer's state (train/optim/state_file.h)
//     resume/trainer.json           the step, the data position, the tokens trained, the seed
//   latest                          a symbolic link to the newest checkpoint
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "train/model/parameters.h"
#include "train/trainer/step_executor.h"
#include "train/trainer/train_config.h"

namespace dsv41::train {

struct StepReport {
  int64_t step = 0;            // steps completed, this one included
  int64_t steps = 0;           // the run's total
  double loss = 0;             // this step's L_lm, the mean over its sequences
  double indexer_loss = 0;     // and its L_indexer
  double dspark_loss = 0;      // and DSpark's loss (0 when DSpark is not trained)
  double lr = 0;               // the schedule's rate for this step's update
  int64_t tokens = 0;          // inputs trained on since the run began (resumes included)
  double tokens_per_second = 0;  // over this process's steps
  double eta_seconds = 0;        // the remaining steps at this process's pace (validation and checkpoints included)
};

struct TrainEvents {
  std::function<void(const StepReport&)> step;    // after every step
  std::function<void(const std::string&)> line;   // a log line for a person: the interval's loss, validation, a checkpoint
};

class Trainer {
 public:
  // A new run into config.out_dir, which must not hold one (resume continues a run). Reads the data,
  // initialises the parameters from the seed, writes train_config.json. `device`: where the steps
  // run (step_executor.h; not part of the run: a run may move between devices at a checkpoint).
  static std::unique_ptr<Trainer> start(TrainConfig config, TrainDevice device = TrainDevice::Cpu);
  // Continues the run in `out_dir` from its newest checkpoint; `steps` replaces the run's total.
  static std::unique_ptr<Trainer> resume(const std::string& out_dir, std::optional<int64_t> steps = std::nullopt,
                                         TrainDevice device = TrainDevice::Cpu);
  ~Trainer();

  // Trains until the run's total, logging, validating and writing checkpoints on the way.
  void run(const TrainEvents& events = {});

  const TrainConfig& config() const;
  int64_t step() const;  // steps completed
  const Parameters<float>& parameters() const;  // the masters (copied from the device first)
  // The mean next-token loss of the current parameters over the validation sequences
  // (validation_tokens' worth of the validation split, in file order).
  double validation_loss();

 private:
  struct Run;
  explicit Trainer(std::unique_ptr<Run> run);
  std::unique_ptr<Run> run_;
};

// The directory name of the checkpoint after step `step`: "step-" and 8 digits.
std::string checkpoint_name(int64_t step);

}  // namespace dsv41::train
