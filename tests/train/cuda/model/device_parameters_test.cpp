// The CUDA trainer's parameters on the device (src/train/cuda/model/device_parameters.h) on the tiny
// preset's whole model (Engram and DSpark included): masters up and back bit for bit, each matrix's
// bf16 copy the host's round-to-nearest-even bits, gradients zeroed and read back, the optimizer's
// view the host's tensors in order with device pointers into the arenas, and bad use refused.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "../../../cuda/device_util.h"
#include "model/config.h"
#include "numerics/types.h"
#include "train/cuda/model/device_parameters.h"
#include "train/model/parameters.h"

namespace dsv41 {
namespace {

TEST(TrainCudaParameters, MastersGradientsAndBf16CopiesMirrorTheHost) {
  DSV41_REQUIRE_DEVICE();
  const Config c = preset("tiny");
  train::Parameters<float> host(c);
  // Values that bf16 rounds both ways, ties included, in every tensor.
  std::mt19937 rng(3);
  for (train::Param<float>& p : host.all())
    for (float& v : p.value) v = std::uniform_real_distribution<float>(-2, 2)(rng);
  host.layer(0).attn.wq_a->value[0] = 1.0f + 0x1p-8f;        // a tie: rounds to even (1.0)
  host.layer(0).attn.wq_a->value[1] = 1.0f + 3 * 0x1p-8f;    // a tie: rounds up to even (1 + 2⁻⁶)

  train_cuda::DeviceParameters dev(host);
  dev.upload();
  train::Parameters<float> back(c);
  for (const train::Param<float>& p : host.all()) back.at(p.name).value = p.value;
  for (train::Param<float>& p : host.all()) std::fill(p.value.begin(), p.value.end(), -1.0f);
  dev.download();
  int64_t matrices = 0;
  for (train::Param<float>& p : host.all()) {
    const std::vector<float>& want = back.at(p.name).value;
    ASSERT_EQ(std::memcmp(p.value.data(), want.data(), want.size() * sizeof(float)), 0) << p.name;
    if (p.shape.size() != 2) {
      EXPECT_THROW(dev.weight_bf16(p), Error) << p.name;
      continue;
    }
    ++matrices;
    std::vector<uint16_t> got(size_t(p.numel()));
    cuda::check(cudaMemcpy(got.data(), dev.weight_bf16(p), got.size() * 2, cudaMemcpyDeviceToHost), "test");
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], bf16_from_float(want[i])) << p.name << "[" << i << "]";
  }
  EXPECT_GT(matrices, 40);

  // Gradients: written on the device, read back; zeroed.
  for (train::Param<float>& p : host.all()) {
    std::vector<float> g(size_t(p.numel()));
    for (size_t i = 0; i < g.size(); ++i) g[i] = float(i % 97) - 48.0f;
    cuda::check(cudaMemcpy(dev.grad(p), g.data(), g.size() * 4, cudaMemcpyHostToDevice), "test");
  }
  dev.download_grads();
  for (const train::Param<float>& p : host.all())
    for (size_t i = 0; i < p.grad.size(); ++i) ASSERT_EQ(p.grad[i], float(i % 97) - 48.0f) << p.name;
  dev.zero_grad();
  dev.download_grads();
  for (const train::Param<float>& p : host.all())
    for (float g : p.grad) ASSERT_EQ(g, 0.0f) << p.name;

  // The optimizer's view: the kept tensors in order, pointers 64-element aligned inside the arena.
  const auto kept = dev.optimizer_parameters([](const std::string& name) { return !name.starts_with("mtp."); });
  size_t i = 0;
  for (train::Param<float>& p : host.all()) {
    if (p.name.starts_with("mtp.")) continue;
    ASSERT_LT(i, kept.size());
    EXPECT_EQ(kept[i].name, p.name);
    EXPECT_EQ(kept[i].shape, p.shape);
    EXPECT_EQ(kept[i].value, dev.value(p));
    EXPECT_EQ(kept[i].grad, dev.grad(p));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(kept[i].value) % 256, 0u) << p.name;
    ++i;
  }
  EXPECT_EQ(i, kept.size());
  EXPECT_LT(kept.size(), host.all().size()) << "DSpark's tensors left out";

  // A tensor of other parameters is refused by name.
  train::Parameters<float> other(c);
  EXPECT_THROW(dev.value(other.embed()), Error);
}

}  // namespace
}  // namespace dsv41
