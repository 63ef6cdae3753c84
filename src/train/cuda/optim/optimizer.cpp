#include "train/cuda/optim/optimizer.h"

#include <utility>

#include "backend/cuda/check.h"
#include "train/cuda/optim/adamw.h"
#include "train/cuda/optim/muon.h"
#include "train/cuda/optim/sinkhorn_update.h"

namespace dsv41::train_cuda::optim {

using dsv41::optim::ParamSlot;
using dsv41::optim::Update;

Optimizer::Optimizer(const Config& config, std::vector<dsv41::optim::Parameter> params, dsv41::optim::OptimizerOptions options,
                     NsPrecision ns_precision, cudaStream_t stream)
    : options_(std::move(options)), stream_(stream), ns_precision_(ns_precision) {
  options_.schedule.validate();
  slots_ = dsv41::optim::plan_parameters(config, std::move(params));
  for (const ParamSlot& s : slots_) {
    std::vector<cuda::DeviceBuffer<float>>& buffers = state_.emplace_back();
    for (size_t b = 0; b < dsv41::optim::state_buffers(s.group.update); ++b) {
      buffers.emplace_back(s.elements);
      if (s.elements > 0)
        cuda::check(cudaMemsetAsync(buffers.back().get(), 0, size_t(s.elements) * sizeof(float), stream_), "optimizer state");
    }
  }
}

void Optimizer::step() {
  const double base = options_.schedule.lr(steps());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    std::vector<cuda::DeviceBuffer<float>>& buf = state_[i];
    // The CPU's rate and options per group (src/train/optim/optimizer.cpp, Optimizer::update).
    const float lr = float(base * s.group.lr_multiplier);
    switch (s.group.update) {
      case Update::Muon: {
        dsv41::optim::MuonOptions o = options_.muon;
        if (!s.group.weight_decay) o.weight_decay = 0;
        muon_step(blas_, s.param.value, s.param.grad, buf[0].get(), s.rows, s.cols, s.group.row_blocks, lr, o, ns_precision_,
                  stream_);
        break;
      }
      case Update::AdamW: {
        dsv41::optim::AdamWOptions o = options_.adamw;
        if (!s.group.weight_decay) o.weight_decay = 0;
        adamw_step(s.param.value, s.param.grad, buf[0].get(), buf[1].get(), s.elements, steps() + 1, lr, o, stream_);
        break;
      }
      case Update::Sinkhorn:
        sinkhorn_step(s.param.value, s.param.grad, buf[0].get(), s.rows, s.cols, lr, options_.sinkhorn, stream_);
        break;
      case Update::ExpertBias: break;  // refused by plan_parameters
    }
  }
  ++steps_;
}

void Optimizer::save(const std::string& path) const {
  dsv41::optim::OptimizerState state;
  state.steps = steps_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    dsv41::optim::StateTensor& t = state.tensors.emplace_back();
    t.name = slots_[i].param.name;
    t.update = uint32_t(slots_[i].group.update);
    for (const cuda::DeviceBuffer<float>& b : state_[i]) t.buffers.push_back(b.download(stream_, slots_[i].elements));
  }
  dsv41::optim::write_optimizer_state(path, state);
}

void Optimizer::load(const std::string& path) {
  const dsv41::optim::OptimizerState loaded = dsv41::optim::read_optimizer_state(path);
  dsv41::optim::check_state_matches(path, slots_, loaded);
  for (size_t i = 0; i < slots_.size(); ++i)
    for (size_t b = 0; b < state_[i].size(); ++b) state_[i][b].upload(loaded.tensors[i].buffers[b], stream_);
  cuda::check(cudaStreamSynchronize(stream_), "optimizer state load");  // the host copies die here
  steps_ = loaded.steps;
}

}  // namespace dsv41::train_cuda::optim
