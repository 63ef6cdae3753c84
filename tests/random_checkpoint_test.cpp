// init-random: a checkpoint in the official layout, reproducible from its seed, with weights
// scaled so activations stay finite.
#include <gtest/gtest.h>

#include <cmath>

#include "model/checkpoint.h"
#include "model/random_checkpoint.h"
#include "model/weights.h"
#include "numerics/codecs.h"
#include "numerics/types.h"
#include "test_util.h"

using namespace dsv41;

namespace {

double stddev(const std::vector<float>& v) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += double(x) * x;
  double m = s / v.size();
  return std::sqrt(s2 / v.size() - m * m);
}

}  // namespace

TEST(RandomCheckpoint, IsReproducibleFromItsSeed) {
  test::TempDir a("random_test"), b("random_test"), other("random_test");
  RandomCheckpointOptions opt;
  opt.quantized = true;
  opt.seed = 7;
  write_random_checkpoint(preset("tiny"), a.string(), opt);
  write_random_checkpoint(preset("tiny"), b.string(), opt);
  opt.seed = 8;
  write_random_checkpoint(preset("tiny"), other.string(), opt);
  EXPECT_EQ(test::read_text(a / "model.safetensors"), test::read_text(b / "model.safetensors"));
  EXPECT_NE(test::read_text(a / "model.safetensors"), test::read_text(other / "model.safetensors"));
}

TEST(RandomCheckpoint, LoadsAsTheConfigItWrote) {
  for (bool quantized : {false, true}) {
    test::TempDir dir("random_test");
    RandomCheckpointOptions opt;
    opt.quantized = quantized;
    write_random_checkpoint(preset("tiny"), dir.string(), opt);
    Config c = load_config(dir.string());
    EXPECT_EQ(c.dtype, quantized ? "fp8" : "bf16");
    Checkpoint ckpt = Checkpoint::open(dir.string());
    EXPECT_NO_THROW(check_weights(c, ckpt));
    EXPECT_EQ(ckpt.get("layers.2.attn.wq_a.weight").dtype, quantized ? DType::F8_E4M3 : DType::BF16);
    EXPECT_EQ(ckpt.get("layers.0.ffn.experts.0.w1.weight").dtype, quantized ? DType::I8 : DType::BF16);
  }
}

TEST(RandomCheckpoint, WeightsAreScaledForFiniteActivations) {
  test::TempDir dir("random_test");
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
}
