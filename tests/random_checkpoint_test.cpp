// init-random: a checkpoint in the official layout, reproducible from its seed, with weights
// scaled so activations stay finite.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/checkpoint.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

using namespace dsv41;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("dsv41_random_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p;
}

std::string bytes_of(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  double m = s / v.size();
  return std::sqrt(s2 / v.size() - m * m);
}

}  // namespace

TEST(RandomCheckpoint, IsReproducibleFromItsSeed) {
  fs::path a = fresh_dir("a"), b = fresh_dir("b"), other = fresh_dir("other");
  RandomCheckpointOptions opt;
  opt.quantized = true;
  opt.seed = 7;
  write_random_checkpoint(preset("tiny"), a.string(), opt);
  write_random_checkpoint(preset("tiny"), b.string(), opt);
  opt.seed = 8;
  write_random_checkpoint(preset("tiny"), other.string(), opt);
  EXPECT_EQ(bytes_of(a / "model.safetensors"), bytes_of(b / "model.safetensors"));
  EXPECT_NE(bytes_of(a / "model.safetensors"), bytes_of(other / "model.safetensors"));
  for (auto& d : {a, b, other}) fs::remove_all(d);
}

TEST(RandomCheckpoint, LoadsAsTheConfigItWrote) {
  for (bool quantized : {false, true}) {
    fs::path dir = fresh_dir(quantized ? "q" : "bf16");
    RandomCheckpointOptions opt;
    opt.quantized = quantized;
    write_random_checkpoint(preset("tiny"), dir.string(), opt);
    Config c = load_config(dir.string());
    EXPECT_EQ(c.dtype, quantized ? "fp8" : "bf16");
    Checkpoint ckpt = Checkpoint::open(dir.string());
    EXPECT_NO_THROW(check_weights(c, ckpt));
    EXPECT_EQ(ckpt.get("layers.2.attn.wq_a.weight").dtype, quantized ? DType::F8_E4M3 : DType::BF16);
    EXPECT_EQ(ckpt.get("layers.0.ffn.experts.0.w1.weight").dtype, quantized ? DType::I8 : DType::BF16);
    fs::remove_all(dir);
  }
}

TEST(RandomCheckpoint, WeightsAreScaledForFiniteActivations) {
  fs::path dir = fresh_dir("scale");
  RandomCheckpointOptions opt;
  opt.quantized = true;
  write_random_checkpoint(preset("tiny"), dir.string(), opt);
  Checkpoint ckpt = Checkpoint::open(dir.string());

  // An fp8 linear [out, in]: after dequantization, unit-variance outputs need std 1/sqrt(in).
  // 4096 samples of a uniform: the sample std is within ~2% of the true one; fp8 rounding adds
  // ~3% relative noise per element, so 10% is a safe bound.
  const TensorView& w = ckpt.get("layers.2.attn.wq_a.weight");
  const TensorView& s = ckpt.get("layers.2.attn.wq_a.scale");
  int out = int(w.shape[0]), in = int(w.shape[1]);
  std::vector<float> deq(size_t(out) * in);
  dequantize_fp8_weight(w.data, s.data, out, in, deq.data());
  EXPECT_NEAR(stddev(deq), 1.0 / std::sqrt(double(in)), 0.1 / std::sqrt(double(in)));
  for (float x : deq) ASSERT_TRUE(std::isfinite(x));

  // An fp4 expert [out, in]: the same target, with e2m1's coarser grid (bound 25%).
  const TensorView& e = ckpt.get("layers.0.ffn.experts.3.w2.weight");
  const TensorView& es = ckpt.get("layers.0.ffn.experts.3.w2.scale");
  out = int(e.shape[0]), in = int(e.shape[1]) * 2;
  std::vector<float> deq4(size_t(out) * in);
  dequantize_fp4_weight(e.data, es.data, out, in, deq4.data());
  EXPECT_NEAR(stddev(deq4), 1.0 / std::sqrt(double(in)), 0.25 / std::sqrt(double(in)));

  // Norm weights start at one.
  const TensorView& norm = ckpt.get("layers.1.attn_norm.weight");
  for (int64_t i = 0; i < norm.numel(); ++i) {
    uint16_t b;
    std::memcpy(&b, norm.data + 2 * i, 2);
    ASSERT_EQ(bf16_to_float(b), 1.0f);
  }
  fs::remove_all(dir);
}
