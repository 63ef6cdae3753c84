#pragma once
// Where a training step's arithmetic runs (docs/training.md, "dsv41 train"): the training model's
// forward and backward, the optimizer's update and the gate biases' — on the CPU (TrainModel, the
// CPU optimizers) or on a GPU (src/train/cuda: CudaTrainModel, the CUDA optimizers, the masters in
// DeviceParameters). The loop, the data, the schedule's bookkeeping, the logs and the checkpoints
// are the trainer's, the same for both; a checkpoint is written from the host parameters, so a run
// moves between the two through its checkpoints.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "train/model/parameters.h"
#include "train/model/train_model.h"
#include "train/trainer/train_config.h"

namespace dsv41::train {

enum class TrainDevice { Cpu, Cuda };

// "cpu" or "cuda"; anything else is an error naming both.
TrainDevice train_device_from_name(const std::string& name);

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;

  // A step's sequences: each one's forward and backward, the gradient of Σ over them of lm_weight ·
  // L_lm + indexer_weight · L_indexer + dspark_weight · L_dspark added into the parameters'
  // gradients. The CPU runs them one by one (TrainModel::forward, then backward), the CUDA trainer
  // as one batch. Returns each sequence's losses.
  virtual std::vector<Losses> forward_backward(std::span<const TrainSequence> batch, float lm_weight, float indexer_weight,
                                               float dspark_weight) = 0;
  // Forwards only (validation): each sequence's losses.
  virtual std::vector<Losses> evaluate(std::span<const TrainSequence> batch) = 0;

  // Where the training steps' time went since the executor was made, in seconds of wall time: the
  // forwards, the backwards, the updates (each timed to its end on the device).
  struct Times {
    double forward = 0, backward = 0, update = 0;
  };
  const Times& times() const { return times_; }
  // Before a step's sequences: the gradients and the expert loads zeroed.
  virtual void zero_grad() = 0;
  // The optimizer's update of every trained parameter, then each gate bias's from the step's loads.
  virtual void step() = 0;
  // Updates made so far (the schedule's position).
  virtual int64_t optimizer_steps() const = 0;
  virtual void save_optimizer(const std::string& path) = 0;
  virtual void load_optimizer(const std::string& path) = 0;
  // The masters into the host parameters (before a checkpoint is written from them).
  virtual void to_host() = 0;
  // The host parameters' values as the masters (after they were read from a checkpoint).
  virtual void from_host() = 0;

 protected:
  Times times_;
};

// Whether the optimizer updates tensor `name`: what a loss reaches — not the gate biases (moved by
// their loads) nor, when DSpark is not trained, its tensors (weight decay alone would shrink them).
bool optimized(const TrainConfig& cfg, const std::string& name);

// The executor of `device` over `params` (which it keeps and updates). Cuda: an error where this
// build has no CUDA.
std::unique_ptr<StepExecutor> make_step_executor(TrainDevice device, Parameters<float>& params, const TrainConfig& cfg);

}  // namespace dsv41::train
