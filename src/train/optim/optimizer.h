#pragma once
// The optimizer of `dsv41 train`: each parameter updated as the parameter-group table says
// (param_groups.h: Muon, AdamW or the Sinkhorn-balanced update, with its learning-rate multiplier
// and weight decay), at the schedule's rate for the step, with its state kept here and saved to a
// state file (state_file.h). The gate's bias is not among the parameters: it has no gradient and
// the trainer moves it by its loads (expert_bias.h).
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "train/optim/adamw.h"
#include "train/optim/muon.h"
#include "train/optim/param_groups.h"
#include "train/optim/schedule.h"
#include "train/optim/sinkhorn_update.h"
#include "train/optim/state_file.h"

namespace dsv41::optim {

struct OptimizerOptions {
  Schedule schedule;
  MuonOptions muon;
  AdamWOptions adamw;
  SinkhornOptions sinkhorn;
};

// A trained tensor: its fp32 master values and its gradient (both [shape], row-major), owned by
// the trainer and read or written by step().
struct Parameter {
  std::string name;  // the weights map's (model/weights.h)
  std::vector<int64_t> shape;
  float* value = nullptr;
  const float* grad = nullptr;
};

// One parameter as the optimizer takes it: its group (param_groups.h) and its shape as its update
// sees it (a matrix [rows, cols]; a non-matrix AdamW tensor as [1, elements]).
struct ParamSlot {
  Parameter param;
  ParamGroup group;
  int64_t rows, cols, elements;
};

// The parameters' slots, in their order, with the table's checks: throws dsv41::Error for a name the
// table does not know, a gate bias, a repeated name, a null pointer, or a shape its update cannot
// take (Muon and Sinkhorn need a matrix; head-wise Muon rows divisible by the heads). Shared with the
// CUDA optimizer (src/train/cuda/optim), whose pointers are device pointers.
std::vector<ParamSlot> plan_parameters(const Config& config, std::vector<Parameter> params);

// The buffers an update keeps per parameter: Muon and Sinkhorn 1 (the momentum), AdamW 2 (m, v).
size_t state_buffers(Update update);

// Checks that `loaded` (read from `path`) is the state of these slots: the same names, updates and
// sizes in the same order; anything else is an error naming the first difference.
void check_state_matches(const std::string& path, const std::vector<ParamSlot>& slots, const OptimizerState& loaded);

class Optimizer {
 public:
  // Throws as plan_parameters does.
  Optimizer(const Config& config, std::vector<Parameter> params, OptimizerOptions options);

  // Updates every parameter from its gradient: step `steps()` of the schedule, then steps() + 1.
  void step();
  int64_t steps() const { return int64_t(state_.steps); }

  void save(const std::string& path) const;
  // Restores the state saved by an optimizer over the same parameters (check_state_matches).
  void load(const std::string& path);

 private:
  void update(size_t i, double base_lr);  // slot i's step at the schedule's rate base_lr

  std::vector<ParamSlot> slots_;
  OptimizerOptions options_;
  OptimizerState state_;  // state_.tensors[i] belongs to slots_[i]
};

}  // namespace dsv41::optim
