// The image path on the CUDA executor against DeepSeek's reference on fixture v41-tiny-vision (what
// forward_vision_parity_test checks on the CPU executor; its comments give the bounds' reasoning):
//  * the vision tower on the device (device_vision.cu, through CudaExecutor::encode_images, both
//    images in one call) against the recorded aligner rows within the baseline's own CPU-vs-CUDA
//    gap of them (kHeadroom over it), and against the CPU tower within twice that (each of the two
//    within it of the reference: the triangle inequality); each image's rows as the image's alone;
//  * the text forward with the recorded aligner rows at the spans (ForwardOptions::span_embeddings:
//    the span rows' embeddings, bias_vl in every gate, Engram's gate shut): against the CPU forward
//    under the CPU's own choices, one-shot and in chunks of 7 (spans cut across calls), within twice
//    the forced figures (the forced and free levels against the reference and the image rows'
//    experts are forward_vision_parity_test's suite over executors, its cuda_executor instance);
//  * the executor's refusals: images for a text-only model, span rows on one.
#include <gtest/gtest.h>

#include <cstring>

#include "../vision_fixture.h"
#include "base/error.h"
#include "device_fixture.h"
#include "device_util.h"
#include "forward/device/cuda_executor.h"
#include "forward/vision_cpu.h"

namespace dsv41 {
namespace {

using namespace dsv41::test;

std::vector<uint16_t> patches_of(const Expected& ex, const std::string& name) {
  const TensorView& t = ex.view(name + ".patches");
  std::vector<uint16_t> bits(size_t(t.numel()));
  std::memcpy(bits.data(), t.data, bits.size() * 2);
  return bits;
}

// The fixture's images as the tower takes them: their recorded patches and patch grids.
struct FixtureImages {
  std::vector<std::vector<uint16_t>> patches;
  std::vector<VisionImage> images;
  explicit FixtureImages(const Expected& ex) {
    for (int j = 0; j < kImages; ++j) patches.push_back(patches_of(ex, image_name(j)));
    for (int j = 0; j < kImages; ++j) {
      const std::vector<int64_t> grid = ex.ints(image_name(j) + ".grid");
      images.push_back(VisionImage{patches[size_t(j)].data(), int(grid[4]), int(grid[5])});
    }
  }
};

struct Gap {
  double max = 0, mean = 0;
};
Gap gap(const std::vector<float>& ours, const std::vector<float>& ref) {
  Gap g;
  if (ours.size() != ref.size()) return {INFINITY, INFINITY};
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(ours[i]) - double(ref[i]));
    g.max = std::max(g.max, d);
    g.mean += d / double(ref.size());
  }
  return g;
}

TEST(VisionDevice, TowerWithinTheReferencesNoise) {
  DSV41_REQUIRE_DEVICE();
  const VisionFixture f;
  const Config& c = f.config();
  const FixtureImages fixture_images(f.ex);
  const std::vector<VisionImage>& images = fixture_images.images;
  std::unique_ptr<Executor> gpu = cuda::make_executor(*f.model);
  ASSERT_TRUE(gpu->takes_images());
  const std::vector<std::vector<float>> ours = gpu->encode_images(images);
  const std::vector<std::vector<float>> cpu = encode_images(c, f.model->vision(), images);
  ASSERT_EQ(ours.size(), size_t(kImages));
  const json& free = f.baseline["modes"]["free"]["prompt1"];
  for (int j = 0; j < kImages; ++j) {
    const json& b = free[image_name(j) + ".embeds"];
    const double bound_max = kHeadroom * b["max"].get<double>(), bound_mean = kHeadroom * b["mean"].get<double>();
    const Gap ref = gap(ours[size_t(j)], f.embeds[size_t(j)]), apart = gap(ours[size_t(j)], cpu[size_t(j)]);
    std::printf("%s on the device: vs reference max %.6f mean %.6f; vs the CPU tower max %.6f mean %.6f | baseline max %.6f mean %.6f\n",
                image_name(j).c_str(), ref.max, ref.mean, apart.max, apart.mean, b["max"].get<double>(), b["mean"].get<double>());
    EXPECT_LE(ref.max, bound_max) << image_name(j);
    EXPECT_LE(ref.mean, bound_mean) << image_name(j);
    EXPECT_LE(apart.max, 2 * bound_max) << image_name(j);
    EXPECT_LE(apart.mean, 2 * bound_mean) << image_name(j);
  }
}

// Each image's rows in a call of both equal that image alone, bit for bit: the per-image ops
// (RoPE places, attention ranges, unshuffle sources) read only the image's own rows, and every
// other op is row by row. The GEMMs too, at these sizes: the fixture's images have 40 and 70 patches
// and 6 and 12 tokens, so alone or together every product is one M tile of the mma.sync GEMM (under
// 128 rows, and K = 592 or N ≤ 192 keeps the warpgroup form out), whose split-K choice depends on M
// only through the tile count (rows.h split_k): each row's sums run in the same order.
TEST(VisionDevice, EachImageAsAlone) {
  DSV41_REQUIRE_DEVICE();
  const VisionFixture f;
  const FixtureImages fixture_images(f.ex);
  const std::vector<VisionImage>& images = fixture_images.images;
  std::unique_ptr<Executor> gpu = cuda::make_executor(*f.model);
  const std::vector<std::vector<float>> together = gpu->encode_images(images);
  const std::vector<std::vector<float>> reversed = gpu->encode_images({images[1], images[0]});
  ASSERT_EQ(together.size(), size_t(kImages));
  for (int j = 0; j < kImages; ++j) {
    const std::vector<std::vector<float>> alone = gpu->encode_images({images[size_t(j)]});
    EXPECT_EQ(alone[0], together[size_t(j)]) << image_name(j);
    EXPECT_EQ(reversed[size_t(kImages - 1 - j)], together[size_t(j)]) << image_name(j);
  }
}

TEST(VisionDevice, SpanRowsMatchCpuForwardUnderItsChoices) {
  DSV41_REQUIRE_DEVICE();
  const VisionFixture cpu, gpu(device_sequences());
  const Config& c = cpu.config();
  for (int prompt = 0; prompt < kPrompts; ++prompt) {
    std::vector<Trace> traces;
    const Logits want = cpu.run(prompt, false, 0, &traces);
    const ChoiceSource cpu_choices = choices_of(traces, c.n_activated_experts);
    Bound base;
    for (const char* part : {"prefill.logits", "decode.logits"}) base.add(cpu.base("forced_topk_routing", prompt, part));
    base.mean *= 2, base.p99 *= 2, base.max *= 2;  // two forwards, each within the figures of the reference
    for (int64_t chunk : {0, 7}) {
      const Logits got = gpu.run(prompt, true, chunk, nullptr, &cpu_choices);
      std::vector<float> ours = got.prefill, ref = want.prefill;
      ours.insert(ours.end(), got.decode.begin(), got.decode.end());
      ref.insert(ref.end(), want.decode.begin(), want.decode.end());
      expect_close(cpu.name + " device vs cpu prompt" + std::to_string(prompt) + " chunk " + std::to_string(chunk), ours, ref,
                   c.vocab_size, base);
    }
  }
}

TEST(VisionDevice, TextOnlyModelRefusesImages) {
  DSV41_REQUIRE_DEVICE();
  const Fixture f("v41-tiny");
  std::unique_ptr<Executor> gpu = cuda::make_executor(*f.model);
  const uint16_t patch[3 * 14 * 14] = {};
  EXPECT_THROW(gpu->encode_images({VisionImage{patch, 1, 1}}), Error);
  std::unique_ptr<Sequence> s = gpu->new_sequence();
  const std::vector<int> tokens = f.tokens(0);
  const std::vector<float> row(size_t(f.config().dim), 0.0f);
  std::vector<const float*> spans(tokens.size(), nullptr);
  spans[0] = row.data();
  ForwardOptions opt;
  opt.span_embeddings = spans.data();
  const std::vector<int64_t> hashes = f.hashes(0);
  EXPECT_THROW(gpu->forward_batch({BatchItem{s.get(), tokens, f.ids(hashes, 0), opt}}), Error);
  EXPECT_EQ(s->length(), 0);
}

}  // namespace
}  // namespace dsv41
