// The optimizer on the device (train_cuda/optim/optimizer.h) against the CPU's
// (src/train/optim/optimizer.h), over one tensor of each kind of the parameter table: the
// embedding, the head and an Engram table (Sinkhorn; Engram at 5× the rate), head-wise query
// projections (attn.wq_b in 4 heads, the indexer's wq_b in 2), the one key head (attn.wkv, whole),
// wo_a in 2 groups and a tall expert matrix (Muon), a norm (AdamW with decay), an mHC bias and the
// attention sink (AdamW without). The two query projections' heads are blocks of one shape (8 × 24),
// so the optimizer orthogonalizes them as one batch across the two matrices. Gradients are fixed
// per step and tensor, not functions of the weights, so the two sides' states stay the same bits
// and only the weights differ.
//
// Checks and bounds (the per-update tests argue them: adamw_test, muon_test, sinkhorn_update_test):
//  * six steps across the warm-up, the peak and the decay: the state files of the two runs are
//    the same bytes (momenta and AdamW's moments depend on the gradients alone, element by element);
//    AdamW's tensors the same bits; Muon's movements within NMSE 36 · 1e-10 + 1e-9 (six steps' worst-
//    case sum of Newton–Schulz's 1e-10 each, and the weights' rounding): bound 5e-9; the Sinkhorn
//    tables within Σ_t 2⁻²³ (max|W| + γη max|U|) per element;
//  * a state saved on the GPU after three steps and loaded by a CPU optimizer over the GPU's
//    weights (the checkpoint), and the other way round: the next step's states the same bytes, the
//    weights within one step's bounds (Muon 1e-10 + the rounding's (6e-8 / 0.0036)² ≈ 3e-10:
//    bound 5e-10);
//  * two runs on the device: the same bits and the same state file;
//  * what the table refuses is refused here too (the CPU's plan_parameters), and a state file of
//    other parameters is an error naming the difference (the CPU's check_state_matches).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "optim_device.h"
#include "train/cuda/optim/optimizer.h"
#include "train/optim/optimizer.h"

namespace dsv41 {
namespace {

using test::DeviceArray;
using optim::Update;

constexpr double kMuonSixSteps = 5e-9, kMuonOneStep = 5e-10;

Config config() {
  Config c;
  c.n_heads = 4;        // attn.wq_b: 4 heads of 8 rows
  c.index_n_heads = 2;  // attn.indexer.wq_b: 2 heads of 8 rows
  c.o_groups = 2;       // attn.wo_a: 2 groups of 8 rows
  return c;
}

optim::OptimizerOptions options() {
  optim::OptimizerOptions o;
  o.schedule.peak_lr = 0.02;
  o.schedule.warmup_steps = 3;
  o.schedule.decay_start = 4;
  o.schedule.decay_steps = 4;
  return o;
}

struct Tensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> value;  // the host copy (the CPU optimizer's, or the start)
  std::vector<float> grad;
};

std::vector<Tensor> model(uint32_t seed) {
  const std::pair<const char*, std::vector<int64_t>> specs[] = {
      {"embed.weight", {64, 16}},
      {"head.weight", {64, 16}},
      {"layers.0.engram.embed.weight", {80, 16}},
      {"layers.0.attn.wq_b.weight", {32, 24}},
      {"layers.0.attn.indexer.wq_b.weight", {16, 24}},
      {"layers.0.attn.wkv.weight", {16, 48}},
      {"layers.0.attn.wo_a.weight", {16, 12}},
      {"layers.0.ffn.shared_experts.w1.weight", {40, 16}},
      {"layers.0.attn_norm.weight", {16}},
      {"layers.0.hc_attn_base", {6}},
      {"layers.0.attn.attn_sink", {4}},
  };
  std::vector<Tensor> tensors;
  for (const auto& [name, shape] : specs) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    tensors.push_back({name, shape, test::normal(n, 1.0, seed++), std::vector<float>(n)});
  }
  return tensors;
}

// Step t's gradient of every tensor (the same for both sides), written in place: the CPU optimizer
// holds pointers to the gradients.
void set_gradients(std::vector<Tensor>& tensors, int step) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::vector<float> g = test::normal(tensors[i].value.size(), std::pow(10.0, -(step % 3)), uint32_t(1000 * step + i));
    std::copy(g.begin(), g.end(), tensors[i].grad.begin());
  }
}

Update update_of(const std::string& name) { return optim::param_group(config(), name).update; }

// The model on the device: its values and gradients, and the optimizer over them.
struct DeviceModel {
  std::vector<std::unique_ptr<DeviceArray<float>>> values, grads;
  std::unique_ptr<train_cuda::optim::Optimizer> opt;

  explicit DeviceModel(const std::vector<Tensor>& tensors) {
    std::vector<optim::Parameter> params;
    for (const Tensor& t : tensors) {
      values.push_back(std::make_unique<DeviceArray<float>>(t.value));
      grads.push_back(std::make_unique<DeviceArray<float>>(t.value.size()));
      params.push_back({t.name, t.shape, values.back()->get(), grads.back()->get()});
    }
    opt = std::make_unique<train_cuda::optim::Optimizer>(config(), std::move(params), options());
  }
  void step(const std::vector<Tensor>& tensors) {
    for (size_t i = 0; i < tensors.size(); ++i) grads[i]->upload(tensors[i].grad);
    opt->step();
  }
  std::vector<std::vector<float>> download() const {
    std::vector<std::vector<float>> out;
    for (const auto& v : values) out.push_back(v->download());
    return out;
  }
};

std::unique_ptr<optim::Optimizer> cpu_optimizer(std::vector<Tensor>& tensors) {
  std::vector<optim::Parameter> params;
  for (Tensor& t : tensors) params.push_back({t.name, t.shape, t.value.data(), t.grad.data()});
  return std::make_unique<optim::Optimizer>(config(), std::move(params), options());
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A path in the temp directory, removed at the end.
struct TempPath {
  std::string path;
  explicit TempPath(const std::string& tag)
      : path((std::filesystem::temp_directory_path() / ("dsv41_cuda_optim_" + tag + "_" + std::to_string(::getpid()))).string()) {}
  ~TempPath() { std::filesystem::remove(path); }
};

// The device's weights against the CPU's, by each tensor's update: AdamW the same bits, Muon's
// movement from `start` within muon_bound (NMSE), the Sinkhorn tables within sinkhorn_bound[i]
// per element.
void expect_close(const std::vector<Tensor>& cpu, const std::vector<std::vector<float>>& gpu,
                  const std::vector<std::vector<float>>& start, double muon_bound, const std::vector<double>& sinkhorn_bound) {
  for (size_t i = 0; i < cpu.size(); ++i) {
    SCOPED_TRACE(cpu[i].name);
    switch (update_of(cpu[i].name)) {
      case Update::AdamW: EXPECT_TRUE(test::same_bits(gpu[i], cpu[i].value)); break;
      case Update::Muon: {
        const double e = test::movement_nmse(gpu[i], cpu[i].value, start[i]);
        std::printf("%s: movement NMSE %.3g\n", cpu[i].name.c_str(), e);
        EXPECT_LE(e, muon_bound);
        break;
      }
      case Update::Sinkhorn: EXPECT_LE(test::max_abs_diff(gpu[i], cpu[i].value), sinkhorn_bound[i]); break;
      case Update::ExpertBias: FAIL() << "not a parameter";
    }
  }
}

// One CPU step of every tensor, adding the Sinkhorn tables' per-element bound for it
// (2⁻²³ (max|W| + γη max|U|), the step's move read off the CPU's).
void cpu_step(optim::Optimizer& opt, const std::vector<Tensor>& tensors, std::vector<double>& sinkhorn_bound) {
  std::vector<std::vector<float>> before;
  for (const Tensor& t : tensors) before.push_back(t.value);
  opt.step();
  for (size_t i = 0; i < tensors.size(); ++i)
    sinkhorn_bound[i] += 0x1p-23 * (test::max_abs(before[i]) + test::max_abs_diff(tensors[i].value, before[i]));
}

TEST(CudaOptimOptimizer, SixStepsMatchTheCpuAndTheStateFilesAreTheSameBytes) {
  DSV41_REQUIRE_DEVICE();
  std::vector<Tensor> cpu = model(1);
  std::vector<std::vector<float>> start;
  for (const Tensor& t : cpu) start.push_back(t.value);
  DeviceModel gpu(cpu);
  std::unique_ptr<optim::Optimizer> opt = cpu_optimizer(cpu);
  std::vector<double> bound(cpu.size(), 0.0);
  for (int step = 0; step < 6; ++step) {
    set_gradients(cpu, step);
    gpu.step(cpu);
    cpu_step(*opt, cpu, bound);
  }
  EXPECT_EQ(gpu.opt->steps(), 6);
  expect_close(cpu, gpu.download(), start, kMuonSixSteps, bound);
  TempPath a("six_gpu"), b("six_cpu");
  gpu.opt->save(a.path);
  opt->save(b.path);
  EXPECT_EQ(file_bytes(a.path), file_bytes(b.path));
}

// Three steps on one side, then its state file and its weights (the checkpoint); a fresh optimizer
// on each side over the checkpoint's weights loads the file and takes step 3. The side that did
// not write the file continues the other's run.
void resume_across(bool from_gpu) {
  std::vector<Tensor> tensors = model(2);
  std::vector<std::vector<float>> weights;
  TempPath saved("resume");
  if (from_gpu) {
    DeviceModel first(tensors);
    for (int step = 0; step < 3; ++step) {
      set_gradients(tensors, step);
      first.step(tensors);
    }
    first.opt->save(saved.path);
    weights = first.download();
  } else {
    std::unique_ptr<optim::Optimizer> first = cpu_optimizer(tensors);
    for (int step = 0; step < 3; ++step) {
      set_gradients(tensors, step);
      first->step();
    }
    first->save(saved.path);
    for (const Tensor& t : tensors) weights.push_back(t.value);
  }

  std::vector<Tensor> resumed = model(99);  // other values, replaced by the checkpoint's
  for (size_t i = 0; i < resumed.size(); ++i) resumed[i].value = weights[i];
  DeviceModel gpu(resumed);
  std::unique_ptr<optim::Optimizer> cpu = cpu_optimizer(resumed);
  gpu.opt->load(saved.path);
  cpu->load(saved.path);
  EXPECT_EQ(gpu.opt->steps(), 3);
  EXPECT_EQ(cpu->steps(), 3);
  set_gradients(resumed, 3);
  std::vector<double> bound(resumed.size(), 0.0);
  gpu.step(resumed);
  cpu_step(*cpu, resumed, bound);
  expect_close(resumed, gpu.download(), weights, kMuonOneStep, bound);
  TempPath a("resume_gpu"), b("resume_cpu");
  gpu.opt->save(a.path);
  cpu->save(b.path);
  EXPECT_EQ(file_bytes(a.path), file_bytes(b.path));
}

TEST(CudaOptimOptimizer, StateSavedOnTheGpuContinuesOnTheCpu) {
  DSV41_REQUIRE_DEVICE();
  resume_across(true);
}

TEST(CudaOptimOptimizer, StateSavedOnTheCpuContinuesOnTheGpu) {
  DSV41_REQUIRE_DEVICE();
  resume_across(false);
}

TEST(CudaOptimOptimizer, TwoRunsAreTheSameBits) {
  DSV41_REQUIRE_DEVICE();
  std::vector<std::vector<float>> values[2];
  std::vector<uint8_t> files[2];
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> tensors = model(3);
    DeviceModel gpu(tensors);
    for (int step = 0; step < 6; ++step) {
      set_gradients(tensors, step);
      gpu.step(tensors);
    }
    values[run] = gpu.download();
    TempPath p("determinism");
    gpu.opt->save(p.path);
    files[run] = file_bytes(p.path);
  }
  for (size_t i = 0; i < values[0].size(); ++i) EXPECT_TRUE(test::same_bits(values[0][i], values[1][i])) << i;
  EXPECT_EQ(files[0], files[1]);
}

std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaOptimOptimizer, RefusesWhatTheCpuRefuses) {
  DSV41_REQUIRE_DEVICE();
  DeviceArray<float> v(12), g(12);
  auto make = [&](std::string name, std::vector<int64_t> shape) {
    train_cuda::optim::Optimizer opt(config(), {{std::move(name), std::move(shape), v.get(), g.get()}}, options());
  };
  EXPECT_THROW(make("layers.0.ffn.gate.bias", {12}), Error);      // moved by its loads
  EXPECT_THROW(make("layers.0.attn.wq_b.weight", {6, 2}), Error);  // 6 rows, 4 heads
  EXPECT_NO_THROW(make("layers.0.attn.wq_a.weight", {3, 4}));

  // A state file of the parameters in another order.
  std::vector<Tensor> tensors = model(4);
  DeviceModel gpu(tensors);
  set_gradients(tensors, 0);
  gpu.step(tensors);
  TempPath saved("mismatch");
  gpu.opt->save(saved.path);
  std::swap(tensors[0], tensors[2]);
  DeviceModel other(tensors);
  EXPECT_NE(error_text([&] { other.opt->load(saved.path); }).find("named 'layers.0.engram.embed.weight'"), std::string::npos);
}

}  // namespace
}  // namespace dsv41
