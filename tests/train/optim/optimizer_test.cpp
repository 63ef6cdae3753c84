// The optimizer (optimizer.h): each parameter updated by its group's rule at the schedule's rate,
// and its state file: save → load → continue gives the same bits as never stopping; wrong,
// damaged and mismatched files are errors naming what was expected.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/optim/optimizer.h"
#include "optim_test_util.h"

namespace dsv41::optim {
namespace {

// A small model's worth of parameters, one of each kind of the table: the embedding and an Engram
// table (Sinkhorn, ×1 and ×5), a head-wise query projection and an expert (Muon), a norm (AdamW
// with decay) and an mHC bias (AdamW without).
struct Model {
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    std::vector<float> value, grad, target;
  };
  std::vector<Tensor> tensors;

  explicit Model(uint32_t seed) {
    const std::pair<const char*, std::vector<int64_t>> specs[] = {
        {"embed.weight", {32, 8}},
        {"layers.0.engram.embed.weight", {40, 8}},
        {"layers.0.attn.wq_b.weight", {16, 12}},
        {"layers.0.ffn.shared_experts.w1.weight", {12, 8}},
        {"layers.0.attn_norm.weight", {8}},
        {"layers.0.hc_attn_base", {6}},
    };
    for (const auto& [name, shape] : specs) {
      size_t n = 1;
      for (int64_t d : shape) n *= size_t(d);
      tensors.push_back({name, shape, test::gaussian(n, 1.0, seed++), std::vector<float>(n), test::gaussian(n, 1.0, seed++)});
    }
  }
  std::vector<Parameter> parameters() {
    std::vector<Parameter> p;
    for (Tensor& t : tensors) p.push_back({t.name, t.shape, t.value.data(), t.grad.data()});
    return p;
  }
  // The gradient of ½ ‖W − target‖² plus a step-dependent perturbation, so that each step's
  // update depends on the weights, the state and the step.
  void gradients(int step) {
    for (Tensor& t : tensors) {
      const std::vector<float> noise = test::gaussian(t.value.size(), 0.1, uint32_t(1000 + step));
      for (size_t k = 0; k < t.value.size(); ++k) t.grad[k] = t.value[k] - t.target[k] + noise[k];
    }
  }
};

Config config() {
  Config c;
  c.n_heads = 4;  // wq_b: 4 heads of 4 rows
  return c;
}

OptimizerOptions options() {
  OptimizerOptions o;
  o.schedule.peak_lr = 0.02;
  o.schedule.warmup_steps = 3;
  o.schedule.decay_start = 4;
  o.schedule.decay_steps = 4;
  return o;
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// 8 steps in one run, against 3 steps, a save, a fresh optimizer over parameters restored from
// copies of the values (the checkpoint), a load, and 5 more steps: the values and the final
// state files are the same bits. The 8 steps cross the warm-up, the peak and the decay.
TEST(Optimizer, SaveLoadContinueIsBitIdentical) {
  Model straight(1);
  {
    Optimizer opt(config(), straight.parameters(), options());
    for (int step = 0; step < 8; ++step) {
      straight.gradients(step);
      opt.step();
    }
    test::TempFile end("optim_end");
    opt.save(end.path());
    Model first(1);
    Optimizer a(config(), first.parameters(), options());
    for (int step = 0; step < 3; ++step) {
      first.gradients(step);
      a.step();
    }
    test::TempFile mid("optim_mid");
    a.save(mid.path());

    Model resumed(999);  // other values, replaced by the checkpoint's
    for (size_t i = 0; i < resumed.tensors.size(); ++i) resumed.tensors[i].value = first.tensors[i].value;
    for (size_t i = 0; i < resumed.tensors.size(); ++i) resumed.tensors[i].target = first.tensors[i].target;
    Optimizer b(config(), resumed.parameters(), options());
    b.load(mid.path());
    EXPECT_EQ(b.steps(), 3);
    for (int step = 3; step < 8; ++step) {
      resumed.gradients(step);
      b.step();
    }
    for (size_t i = 0; i < straight.tensors.size(); ++i) {
      const std::vector<float>&x = straight.tensors[i].value, &y = resumed.tensors[i].value;
      ASSERT_EQ(x.size(), y.size());
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << straight.tensors[i].name;
    }
    test::TempFile end_b("optim_end_b");
    b.save(end_b.path());
    EXPECT_EQ(file_bytes(end.path()), file_bytes(end_b.path()));
  }
}

// The step spreads the tensors over the threads: on one thread or on several, the same bits.
TEST(Optimizer, TheSameBitsOnAnyNumberOfThreads) {
  std::vector<Model> runs;
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 4}) {
    omp_set_num_threads(threads);
    Model& m = runs.emplace_back(1);
    Optimizer opt(config(), m.parameters(), options());
    for (int step = 0; step < 4; ++step) {
      m.gradients(step);
      opt.step();
    }
  }
  omp_set_num_threads(threads_before);
  for (size_t i = 0; i < runs[0].tensors.size(); ++i) {
    const std::vector<float>&x = runs[0].tensors[i].value, &y = runs[1].tensors[i].value;
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << runs[0].tensors[i].name;
  }
}

// The first step runs at lr(0) = peak / 3: the norm moves by exactly lr(0) sign(g) after its decay
// (AdamW's first step, ε = 1e-20), the mHC bias without decay, and the Engram table by 5 times
// what the embedding moves for the same gradient (both Sinkhorn, same shape here).
TEST(Optimizer, GroupsGetTheirRuleRateAndMultiplier) {
  Model m(5);
  Model::Tensor& engram = m.tensors[1];
  engram.shape = {32, 8};
  engram.value = m.tensors[0].value;
  engram.target = m.tensors[0].target;
  engram.grad.resize(engram.value.size());
  const Model before = m;
  Optimizer opt(config(), m.parameters(), options());
  m.gradients(0);
  opt.step();
  const double lr0 = 0.02 / 3;
  for (size_t k = 0; k < 8; ++k) {
    const Model::Tensor &t = m.tensors[4], &b = before.tensors[4];
    const double sign = t.grad[k] > 0 ? 1 : -1;
    EXPECT_NEAR(t.value[k], b.value[k] * (1 - lr0 * 0.1) - lr0 * sign, 1e-6) << "attn_norm " << k;
  }
  for (size_t k = 0; k < 6; ++k) {
    const Model::Tensor &t = m.tensors[5], &b = before.tensors[5];
    EXPECT_NEAR(t.value[k], b.value[k] - lr0 * (t.grad[k] > 0 ? 1 : -1), 1e-6) << "hc_attn_base " << k;
  }
  std::vector<float> d_embed(engram.value.size());
  for (size_t k = 0; k < engram.value.size(); ++k) {
    d_embed[k] = m.tensors[0].value[k] - before.tensors[0].value[k];
    const double d_engram = double(engram.value[k]) - before.tensors[1].value[k];
    // Steps of 0.18 · lr0 ≈ 1e-3 on values of order 1: the rounding of the values (6e-8) bounds
    // the difference.
    EXPECT_NEAR(d_engram, 5 * double(d_embed[k]), 1e-6) << k;
  }
  // Every row of the balanced update has RMS 1 (nothing masked here), so the embedding's step has
  // RMS 0.18 lr0; the values' rounding (6e-8 against 1.2e-3) allows 1e-4 of it.
  EXPECT_NEAR(test::rms(d_embed.data(), d_embed.size()), 0.18 * lr0, 1e-4 * 0.18 * lr0);
}

TEST(Optimizer, RefusesWhatTheTableDoesNotAllow) {
  std::vector<float> v(12), g(12);
  auto make = [&](std::string name, std::vector<int64_t> shape) {
    std::vector<Parameter> p = {{std::move(name), std::move(shape), v.data(), g.data()}};
    Optimizer opt(config(), std::move(p), options());
  };
  EXPECT_THROW(make("layers.0.ffn.gate.bias", {12}), Error);          // moved by its loads
  EXPECT_THROW(make("layers.0.attn.wq_b.weight", {6, 2}), Error);      // 6 rows, 4 heads
  EXPECT_THROW(make("layers.0.attn.wq_a.weight", {12}), Error);        // Muon needs a matrix
  EXPECT_THROW(make("layers.0.attn.wq_a.bias", {12}), Error);          // not in the table
  EXPECT_NO_THROW(make("layers.0.attn.wq_a.weight", {3, 4}));
  std::vector<Parameter> twice = {{"norm.weight", {12}, v.data(), g.data()}, {"norm.weight", {12}, v.data(), g.data()}};
  EXPECT_THROW(Optimizer(config(), twice, options()), Error);
}

std::string error_text(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Optimizer, StateFileMismatchesAndDamageAreErrors) {
  Model m(7);
  Optimizer opt(config(), m.parameters(), options());
  m.gradients(0);
  opt.step();
  test::TempFile file("optim_state");
  opt.save(file.path());

  // Another parameter set: a tensor missing, or in another order.
  Model other(7);
  std::vector<Parameter> fewer = other.parameters();
  fewer.pop_back();
  Optimizer small(config(), fewer, options());
  EXPECT_NE(error_text([&] { small.load(file.path()); }).find("5 tensors"), std::string::npos);
  std::vector<Parameter> swapped = other.parameters();
  std::swap(swapped[0], swapped[1]);
  Optimizer reordered(config(), swapped, options());
  EXPECT_NE(error_text([&] { reordered.load(file.path()); }).find("named 'layers.0.engram.embed.weight'"), std::string::npos);

  const std::vector<uint8_t> good = file_bytes(file.path());
  auto write = [&](const std::vector<uint8_t>& bytes) {
    std::ofstream out(file.path(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  };
  std::vector<uint8_t> flipped = good;
  flipped[good.size() / 2] ^= 0x10;
  write(flipped);
  EXPECT_NE(error_text([&] { opt.load(file.path()); }).find("checksum"), std::string::npos);
  write(std::vector<uint8_t>(good.begin(), good.end() - 100));
  EXPECT_NE(error_text([&] { opt.load(file.path()); }).find("checksum"), std::string::npos);
  std::vector<uint8_t> magic = good;
  magic[0] = 'X';
  write(magic);
  EXPECT_NE(error_text([&] { opt.load(file.path()); }).find("DSV41OPT"), std::string::npos);
  write(good);
  EXPECT_NO_THROW(opt.load(file.path()));
  EXPECT_EQ(opt.steps(), 1);
  EXPECT_NE(error_text([&] { opt.load(file.path() + ".missing"); }).find("no file"), std::string::npos);
}

}  // namespace
}  // namespace dsv41::optim
