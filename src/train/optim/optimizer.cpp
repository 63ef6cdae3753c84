#include "train/optim/optimizer.h"

#include <exception>
#include <functional>
#include <numeric>
#include <set>
#include <utility>

#include "base/error.h"

namespace dsv41::optim {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

std::vector<ParamSlot> plan_parameters(const Config& config, std::vector<Parameter> params) {
  std::set<std::string> names;
  std::vector<ParamSlot> slots;
  for (Parameter& p : params) {
    const std::string where = "optimizer, tensor '" + p.name + "'";
    if (!names.insert(p.name).second) fail(where, "each parameter once", "it twice");
    if (!p.value || !p.grad) fail(where, "its values and its gradient", "a null pointer");
    const ParamGroup group = param_group(config, p.name);
    if (group.update == Update::ExpertBias)
      fail(where, "a parameter trained by its gradient", "the gate's bias (moved by its loads: expert_bias.h)");
    const int64_t elements = std::accumulate(p.shape.begin(), p.shape.end(), int64_t(1), std::multiplies<>());
    const bool matrix = p.shape.size() == 2 && elements > 0;
    if (group.update != Update::AdamW && !matrix)
      fail(where, std::string("a matrix for ") + update_name(group.update), "shape " + shape_text(p.shape));
    if (group.update == Update::Muon && p.shape[0] % group.row_blocks != 0)
      fail(where, std::to_string(group.row_blocks) + " blocks of rows for head-wise Muon", "shape " + shape_text(p.shape));
    const int64_t rows = matrix ? p.shape[0] : 1, cols = matrix ? p.shape[1] : elements;
    slots.push_back({std::move(p), group, rows, cols, elements});
  }
  return slots;
}

size_t state_buffers(Update update) { return update == Update::AdamW ? 2 : 1; }

void check_state_matches(const std::string& path, const std::vector<ParamSlot>& slots, const OptimizerState& loaded) {
  if (loaded.tensors.size() != slots.size())
    fail(path, std::to_string(slots.size()) + " tensors (this optimizer's parameters)", std::to_string(loaded.tensors.size()));
  for (size_t i = 0; i < slots.size(); ++i) {
    const ParamSlot& want = slots[i];
    const StateTensor& got = loaded.tensors[i];
    const std::string at = "tensor " + std::to_string(i), name = want.param.name;
    const size_t buffers = state_buffers(want.group.update);
    if (got.name != name) fail(path, at + " named '" + name + "'", "'" + got.name + "'");
    if (got.update != uint32_t(want.group.update))
      fail(path, at + " ('" + name + "') with the state of " + update_name(want.group.update), "update " + std::to_string(got.update));
    if (got.buffers.size() != buffers || int64_t(got.buffers.front().size()) != want.elements)
      fail(path, at + " ('" + name + "') with " + std::to_string(buffers) + " buffer(s) of " + std::to_string(want.elements) +
                     " elements",
           std::to_string(got.buffers.size()) + " of " + std::to_string(got.buffers.empty() ? 0 : got.buffers.front().size()));
  }
}

Optimizer::Optimizer(const Config& config, std::vector<Parameter> params, OptimizerOptions options)
    : options_(std::move(options)) {
  options_.schedule.validate();
  slots_ = plan_parameters(config, std::move(params));
  for (const ParamSlot& s : slots_)
    state_.tensors.push_back({s.param.name, uint32_t(s.group.update),
                              std::vector<std::vector<float>>(state_buffers(s.group.update), std::vector<float>(size_t(s.elements)))});
}

void Optimizer::step() {
  const double base = options_.schedule.lr(steps());
  // Each tensor's update reads and writes only its own values, gradient and state, and computes
  // the same bits on any thread (the GEMM's summation order does not depend on the threads): the
  // tensors are spread over the threads, one parallel region per step rather than one per product
  // of the many small matrices (a tiny model's step was mostly the threads' start-up and waiting).
  // An error cannot leave a parallel region: the first is kept and thrown after it.
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t i = 0; i < slots_.size(); ++i) {
    try {
      update(i, base);
    } catch (...) {
#pragma omp critical(optimizer_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  ++state_.steps;
}

void Optimizer::update(size_t i, double base) {
  ParamSlot& s = slots_[i];
  std::vector<std::vector<float>>& buf = state_.tensors[i].buffers;
  const float lr = float(base * s.group.lr_multiplier);
  switch (s.group.update) {
    case Update::Muon: {
      MuonOptions o = options_.muon;
      if (!s.group.weight_decay) o.weight_decay = 0;
      muon_step(s.param.value, s.param.grad, buf[0].data(), s.rows, s.cols, s.group.row_blocks, lr, o);
      break;
    }
    case Update::AdamW: {
      AdamWOptions o = options_.adamw;
      if (!s.group.weight_decay) o.weight_decay = 0;
      adamw_step(s.param.value, s.param.grad, buf[0].data(), buf[1].data(), s.elements, steps() + 1, lr, o);
      break;
    }
    case Update::Sinkhorn:
      sinkhorn_step(s.param.value, s.param.grad, buf[0].data(), s.rows, s.cols, lr, options_.sinkhorn);
      break;
    case Update::ExpertBias: break;  // refused by the constructor
  }
}

void Optimizer::save(const std::string& path) const { write_optimizer_state(path, state_); }

void Optimizer::load(const std::string& path) {
  OptimizerState loaded = read_optimizer_state(path);
  check_state_matches(path, slots_, loaded);
  state_ = std::move(loaded);
}

}  // namespace dsv41::optim
