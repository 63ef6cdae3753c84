#include "train/trainer/step_executor.h"

#include <chrono>

#include "base/error.h"
#include "train/optim/expert_bias.h"
#include "train/optim/optimizer.h"
#include "train/optim/param_groups.h"

#ifdef DSV41_HAVE_CUDA
#include "backend/cuda/check.h"
#include "train/cuda/model/cuda_train_model.h"
#include "train/cuda/model/device_parameters.h"
#include "train/cuda/optim/expert_bias.h"
#include "train/cuda/optim/optimizer.h"
#endif

namespace dsv41::train {

TrainDevice train_device_from_name(const std::string& name) {
  if (name == "cpu") return TrainDevice::Cpu;
  if (name == "cuda") return TrainDevice::Cuda;
  fail("--device", "cpu or cuda", "\"" + name + "\"");
}

bool optimized(const TrainConfig& cfg, const std::string& name) {
  if (name.starts_with("mtp.") && !cfg.trains_dspark()) return false;
  return optim::param_group(cfg.model, name).update != optim::Update::ExpertBias;
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point from, Clock::time_point to) { return std::chrono::duration<double>(to - from).count(); }

// update(bias, l) for each gate bias: the backbone's layers', and DSpark's stages' when it is trained.
template <class Update>
void for_each_gate_bias(const TrainConfig& cfg, Parameters<float>& params, Update update) {
  for (int l = 0; l < (cfg.trains_dspark() ? params.blocks() : cfg.model.n_layers); ++l)
    if (Param<float>* bias = params.layer(l).gate_bias) update(*bias, l);
}

class CpuStepExecutor final : public StepExecutor {
 public:
  CpuStepExecutor(Parameters<float>& params, const TrainConfig& cfg) : params_(params), cfg_(cfg), model_(params, cfg.qat) {
    std::vector<optim::Parameter> trained;
    for (Param<float>& p : params.all())
      if (optimized(cfg, p.name)) trained.push_back({p.name, p.shape, p.v(), p.g()});
    optimizer_ = std::make_unique<optim::Optimizer>(cfg.model, std::move(trained), cfg.optimizer);
  }

  std::vector<Losses> forward_backward(std::span<const TrainSequence> batch, float lm_weight, float indexer_weight,
                                       float dspark_weight) override {
    std::vector<Losses> losses;
    for (const TrainSequence& q : batch) {
      const Clock::time_point t0 = Clock::now();
      losses.push_back(model_.forward(q.tokens, q.engram_ids, nullptr, q.anchors, q.calls));
      const Clock::time_point t1 = Clock::now();
      model_.backward(lm_weight, indexer_weight, dspark_weight);
      times_.forward += seconds(t0, t1);
      times_.backward += seconds(t1, Clock::now());
    }
    return losses;
  }
  std::vector<Losses> evaluate(std::span<const TrainSequence> batch) override {
    std::vector<Losses> losses;
    for (const TrainSequence& q : batch) losses.push_back(model_.forward(q.tokens, q.engram_ids, nullptr, q.anchors, q.calls));
    return losses;
  }
  void zero_grad() override {
    params_.zero_grad();
    model_.reset_expert_load();
  }
  void step() override {
    const Clock::time_point t0 = Clock::now();
    optimizer_->step();
    for_each_gate_bias(cfg_, params_, [&](Param<float>& bias, int l) {
      optim::update_expert_bias(bias.v(), model_.expert_load()[size_t(l)].data(), bias.numel(), float(cfg_.expert_bias_rate));
    });
    times_.update += seconds(t0, Clock::now());
  }
  int64_t optimizer_steps() const override { return optimizer_->steps(); }
  void save_optimizer(const std::string& path) override { optimizer_->save(path); }
  void load_optimizer(const std::string& path) override { optimizer_->load(path); }
  void to_host() override {}    // the masters are the host parameters
  void from_host() override {}

 private:
  Parameters<float>& params_;
  const TrainConfig& cfg_;
  TrainModel<float> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
};

#ifdef DSV41_HAVE_CUDA
class CudaStepExecutor final : public StepExecutor {
 public:
  CudaStepExecutor(Parameters<float>& params, const TrainConfig& cfg)
      : params_(params), cfg_(cfg), device_(params), model_(params, device_, cfg.qat) {
    device_.upload();
    optimizer_ = std::make_unique<train_cuda::optim::Optimizer>(
        cfg.model, device_.optimizer_parameters([&](const std::string& name) { return optimized(cfg, name); }), cfg.optimizer);
  }

  std::vector<Losses> forward_backward(std::span<const TrainSequence> batch, float lm_weight, float indexer_weight,
                                       float dspark_weight) override {
    const Clock::time_point t0 = Clock::now();
    std::vector<Losses> losses = model_.forward(batch);
    cuda::check(cudaDeviceSynchronize(), "train forward");
    const Clock::time_point t1 = Clock::now();
    model_.backward(lm_weight, indexer_weight, dspark_weight);
    cuda::check(cudaDeviceSynchronize(), "train backward");
    times_.forward += seconds(t0, t1);
    times_.backward += seconds(t1, Clock::now());
    return losses;
  }
  std::vector<Losses> evaluate(std::span<const TrainSequence> batch) override { return model_.forward(batch); }
  void zero_grad() override {
    device_.zero_grad();
    model_.reset_expert_load();
  }
  // The gate biases move on the device, by the CPU's update (the same bits), from the loads the
  // forward counted on the host: one upload of each layer's loads, no download.
  void step() override {
    const Clock::time_point t0 = Clock::now();
    optimizer_->step();
    for_each_gate_bias(cfg_, params_, [&](Param<float>& bias, int l) {
      train_cuda::optim::update_expert_bias_by_host_loads(device_.value(bias), model_.expert_load()[size_t(l)],
                                                          float(cfg_.expert_bias_rate), model_.uploads());
    });
    device_.cast_weights();
    cuda::check(cudaDeviceSynchronize(), "train update");
    times_.update += seconds(t0, Clock::now());
  }
  int64_t optimizer_steps() const override { return optimizer_->steps(); }
  void save_optimizer(const std::string& path) override { optimizer_->save(path); }
  void load_optimizer(const std::string& path) override { optimizer_->load(path); }
  void to_host() override { device_.download(); }
  void from_host() override { device_.upload(); }

 private:
  Parameters<float>& params_;
  const TrainConfig& cfg_;
  train_cuda::DeviceParameters device_;
  train_cuda::CudaTrainModel model_;
  std::unique_ptr<train_cuda::optim::Optimizer> optimizer_;
};
#endif

}  // namespace

std::unique_ptr<StepExecutor> make_step_executor(TrainDevice device, Parameters<float>& params, const TrainConfig& cfg) {
  if (device == TrainDevice::Cpu) return std::make_unique<CpuStepExecutor>(params, cfg);
#ifdef DSV41_HAVE_CUDA
  return std::make_unique<CudaStepExecutor>(params, cfg);
#else
  fail("--device cuda", "a dsv41 built with CUDA", "a build without it (train with --device cpu)");
#endif
}

}  // namespace dsv41::train
