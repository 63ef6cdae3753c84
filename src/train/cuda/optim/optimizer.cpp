#include "train/cuda/optim/optimizer.h"

#include <algorithm>
#include <utility>

#include "backend/cuda/check.h"
#include "train/cuda/optim/adamw.h"
#include "train/cuda/optim/muon.h"
#include "train/cuda/optim/nesterov.h"
#include "train/cuda/optim/sinkhorn_update.h"

namespace dsv41::train_cuda::optim {

using dsv41::optim::ParamSlot;
using dsv41::optim::Update;

Optimizer::Optimizer(const Config& config, std::vector<dsv41::optim::Parameter> params, dsv41::optim::OptimizerOptions options,
                     NsPrecision ns_precision, cudaStream_t stream)
    : options_(std::move(options)), stream_(stream), ns_precision_(ns_precision) {
  options_.schedule.validate();
  slots_ = dsv41::optim::plan_parameters(config, std::move(params));
  constexpr int64_t kMaxBlocks = 65535;  // orthogonalize's grid limit
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    if (s.group.update != Update::Muon) continue;
    const int64_t block_rows = s.rows / s.group.row_blocks;
    auto batch = std::find_if(muon_batches_.begin(), muon_batches_.end(), [&](const MuonBatch& b) {
      return b.block_rows == block_rows && b.cols == s.cols && b.blocks + s.group.row_blocks <= kMaxBlocks;
    });
    if (batch == muon_batches_.end()) batch = muon_batches_.insert(batch, {.block_rows = block_rows, .cols = s.cols, .blocks = 0, .slots = {}});
    batch->blocks += s.group.row_blocks;
    batch->slots.push_back(i);
  }
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
  // The CPU's rate and options per group (src/train/optim/optimizer.cpp, Optimizer::update).
  auto rate = [&](const ParamSlot& s) { return float(base * s.group.lr_multiplier); };
  auto muon_options = [&](const ParamSlot& s) {
    dsv41::optim::MuonOptions o = options_.muon;
    if (!s.group.weight_decay) o.weight_decay = 0;
    return o;
  };
  for (size_t i = 0; i < slots_.size(); ++i) {
    const ParamSlot& s = slots_[i];
    std::vector<cuda::DeviceBuffer<float>>& buf = state_[i];
    switch (s.group.update) {
      case Update::AdamW: {
        dsv41::optim::AdamWOptions o = options_.adamw;
        if (!s.group.weight_decay) o.weight_decay = 0;
        adamw_step(s.param.value, s.param.grad, buf[0].get(), buf[1].get(), s.elements, steps() + 1, rate(s), o, stream_);
        break;
      }
      case Update::Sinkhorn:
        sinkhorn_step(s.param.value, s.param.grad, buf[0].get(), s.rows, s.cols, rate(s), options_.sinkhorn, stream_);
        break;
      case Update::Muon: break;  // below, a batch of blocks at a time
      case Update::ExpertBias: break;  // refused by plan_parameters
    }
  }
  for (const MuonBatch& batch : muon_batches_) {
    const int64_t block = batch.block_rows * batch.cols;
    cuda::DeviceBuffer<float> update(batch.blocks * block, stream_, true);
    float* at = update.get();
    for (size_t i : batch.slots) {
      nesterov_momentum(slots_[i].param.grad, state_[i][0].get(), slots_[i].elements, options_.muon.momentum, at, stream_);
      at += slots_[i].elements;
    }
    orthogonalize(blas_, update.get(), batch.blocks, batch.block_rows, batch.cols, ns_precision_, stream_);
    at = update.get();
    for (size_t i : batch.slots) {
      const ParamSlot& s = slots_[i];
      muon_apply(s.param.value, at, s.elements, batch.block_rows, batch.cols, rate(s), muon_options(s), stream_);
      at += s.elements;
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
