// The image path against DeepSeek's reference on fixture v41-tiny-vision (its README lists every
// tensor and the reference's call sequence; baseline.json is the reference rerun on CUDA against
// its own CPU fixture, the noise floor of a second correct implementation):
//  * preprocessing: the resize plans, the fitted pixels and the ViT patches, exactly;
//  * the vision tower: the unshuffle exactly, the aligner and the whole tower within the
//    baseline's bf16 noise;
//  * the engine: the prompts' tokens and image places from their text and PNGs, the embeddings the
//    prefill starts from (the recorded aligner rows fed in) and the Engram hash ids, exactly;
//  * the text forward with the recorded aligner rows at the spans, at forward_fixture.h's forced
//    and free levels, and the experts of image rows (which bias_vl chooses), on every executor.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <set>

#include "backend/cpu/pixel_unshuffle.h"
#include "base/error.h"
#include "backend/cpu/vision.h"
#include "engine/executors.h"
#include "engine/prompt_image.h"
#include "engine/session.h"
#include "forward/vision_cpu.h"
#include "forward_fixture.h"
#include "vision_fixture.h"
#include "model/image/decode.h"
#include "model/image/preprocess.h"
#include "model/tokenizer/tokenizer.h"
#include "numerics/types.h"
#include "test_util.h"

namespace dsv41 {
namespace {

using test::Expected;
using test::Fixture;
using test::image_name;
using test::kImages;
using test::kName;
using test::kPrompts;
using test::LogitStats;
using test::VisionFixture;

std::vector<uint8_t> file_bytes(const std::string& path) {
  const std::string text = test::read_text(path);
  return std::vector<uint8_t>(text.begin(), text.end());
}

// A tensor's bf16 values as their bits.
std::vector<uint16_t> bf16_bits(const Expected& ex, const std::string& name) {
  const TensorView& t = ex.view(name);
  std::vector<uint16_t> bits(size_t(t.numel()));
  std::memcpy(bits.data(), t.data, bits.size() * 2);
  return bits;
}

// --- preprocessing --------------------------------------------------------------------------------

// plan_image_grid for the table of sizes under the fixture's and the released vision settings
// ([n_llm_h, n_llm_w, best_h, best_w]; -1: the reference's assertion fails).
TEST(VisionParity, ResizePlansAreTheReferences) {
  const Expected ex(kName);
  const std::vector<int64_t> sizes = ex.ints("vision.plan.sizes");
  const VisionConfig fixture = load_config(test::fixture_dir(kName)).vision, released = preset("deepseek-v4.1-flash").vision;
  for (const auto& [config, table] : {std::pair{fixture, ex.ints("vision.plan.fixture")}, std::pair{released, ex.ints("vision.plan.released")}}) {
    for (size_t k = 0; k < sizes.size() / 2; ++k) {
      const int w = int(sizes[2 * k]), h = int(sizes[2 * k + 1]);
      const std::vector<int64_t> want(table.begin() + int64_t(4 * k), table.begin() + int64_t(4 * k + 4));
      if (want[0] < 0) {
        EXPECT_THROW(plan_image(w, h, config), ImageError) << w << " x " << h;
        continue;
      }
      const ImagePlan p = plan_image(w, h, config);
      EXPECT_EQ((std::vector<int64_t>{p.n_llm_h, p.n_llm_w, p.best_height, p.best_width}), want) << w << " x " << h;
    }
  }
}

// The PNGs decoded, planned, fitted (image1 through Pillow's bicubic resize and the grey pad) and
// cut into patches: every pixel and every bf16 patch value the reference's.
TEST(VisionParity, FittedPixelsAndPatchesAreTheReferences) {
  const Expected ex(kName);
  const Config c = load_config(test::fixture_dir(kName));
  for (int j = 0; j < kImages; ++j) {
    const std::string name = image_name(j);
    const std::vector<uint8_t> png = file_bytes(test::fixture_dir(kName) + "/" + name + ".png");
    const RgbImage image = decode_image(png.data(), png.size());
    const ImagePlan plan = plan_image(image.width, image.height, c.vision);
    EXPECT_EQ(ex.ints(name + ".grid"), (std::vector<int64_t>{image.width, image.height, plan.best_width, plan.best_height,
                                                             plan.n_vit_h, plan.n_vit_w, plan.n_llm_h, plan.n_llm_w}))
        << name;
    const RgbImage fitted = fit_image(image, plan, c.vision);
    const TensorView& rgb = ex.view(name + ".rgb");
    ASSERT_EQ(fitted.pixels.size(), rgb.nbytes) << name;
    EXPECT_EQ(std::memcmp(fitted.pixels.data(), rgb.data, rgb.nbytes), 0) << name;
    EXPECT_EQ(image_patches(fitted, plan, c.vision.patch_size), bf16_bits(ex, name + ".patches")) << name;
  }
}

// --- the vision tower ---------------------------------------------------------------------------

// |ours - reference| over bf16 tensors, relative to the reference's largest magnitude too.
struct Gap {
  double max = 0, mean = 0, rel_max = 0;
};
Gap gap(const std::vector<float>& ours, const std::vector<float>& ref) {
  Gap g;
  double scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(ours[i]) - double(ref[i]));
    g.max = std::max(g.max, d);
    g.mean += d / double(ref.size());
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  g.rel_max = g.max / scale;
  return g;
}

// The unshuffle is a rearrangement: from the recorded ViT output, the recorded aligner input, bit
// for bit. The aligner (w1, GELU, w2) from the recorded input, and the whole tower from the
// recorded patches, against the recorded aligner rows: within the baseline's own CPU-vs-CUDA gap
// of the aligner rows (the same rounding points, another summation order; kHeadroom over it) —
// the reference's CUDA rerun matched every ViT intermediate bit for bit and parted only at the
// aligner, by up to one bf16 ulp at its output's magnitude.
TEST(VisionParity, VisionTowerWithinTheReferencesNoise) {
  const VisionFixture f;
  const Config& c = f.config();
  const VisionConfig& v = c.vision;
  const VisionWeights& w = f.model->vision();
  const test::json& free = f.baseline["modes"]["free"]["prompt1"];
  for (int j = 0; j < kImages; ++j) {
    const std::string name = image_name(j);
    const std::vector<int64_t> grid = f.ex.ints(name + ".grid");
    const int n_h = int(grid[4]), n_w = int(grid[5]);
    const int64_t tokens = grid[6] * grid[7], r2 = int64_t(v.downsample_ratio) * v.downsample_ratio;

    const std::vector<float> vit_out = f.ex.floats(name + ".vit_out");
    std::vector<float> unshuffled(size_t(tokens * v.dim * r2));
    pixel_unshuffle(vit_out.data(), n_h, n_w, v.dim, v.downsample_ratio, unshuffled.data());
    EXPECT_EQ(unshuffled, f.ex.floats(name + ".aligner_in")) << name;

    const test::json& b = free[name + ".embeds"];
    const double bound_max = test::kHeadroom * b["max"].get<double>(), bound_mean = test::kHeadroom * b["mean"].get<double>();
    const std::vector<float>& ref = f.embeds[size_t(j)];
    std::vector<float> hidden(size_t(tokens * c.dim)), aligned(size_t(tokens * c.dim));
    linear_bias(unshuffled.data(), tokens, w.aligner_w1, &w.aligner_w1_bias, hidden.data());
    gelu(hidden.data(), int64_t(hidden.size()));
    linear_bias(hidden.data(), tokens, w.aligner_w2, &w.aligner_w2_bias, aligned.data());
    const Gap a = gap(aligned, ref);

    const std::vector<uint16_t> patches = bf16_bits(f.ex, name + ".patches");
    const std::vector<float> ours = encode_images(c, w, {VisionImage{patches.data(), n_h, n_w}}).front();
    const Gap t = gap(ours, ref);
    std::printf("%s: aligner max %.6f mean %.6f; tower max %.6f mean %.6f rel %.6f | baseline max %.6f mean %.6f\n",
                name.c_str(), a.max, a.mean, t.max, t.mean, t.rel_max, b["max"].get<double>(), b["mean"].get<double>());
    EXPECT_LE(a.max, bound_max) << name;
    EXPECT_LE(a.mean, bound_mean) << name;
    EXPECT_LE(t.max, bound_max) << name;
    EXPECT_LE(t.mean, bound_mean) << name;
  }
}

// --- the engine ------------------------------------------------------------------------------

// The CPU executor with the recorded aligner rows for the vision tower: an image the session hands
// it must be one of the fixture's (its patches those recorded), and gets that image's recorded rows,
// so that the session's prefill embeddings are comparable with the reference's bit for bit.
class RecordedVision final : public Executor {
 public:
  explicit RecordedVision(const VisionFixture& f) : f_(f), cpu_(*f.model) {}
  const Model& model() const override { return cpu_.model(); }
  std::string name() const override { return "cpu with recorded aligner rows"; }
  std::unique_ptr<Sequence> new_sequence() override { return cpu_.new_sequence(); }
  std::vector<std::vector<float>> forward_batch(const std::vector<BatchItem>& batch) override { return cpu_.forward_batch(batch); }
  bool takes_images() const override { return true; }
  std::vector<std::vector<float>> encode_images(const std::vector<VisionImage>& images) override {
    std::vector<std::vector<float>> out;
    for (const VisionImage& im : images) {
      const int64_t n = int64_t(im.n_vit_h) * im.n_vit_w * 3 * 14 * 14;
      for (int j = 0; j < kImages && out.size() < size_t(&im - images.data()) + 1; ++j) {
        const std::vector<uint16_t> recorded = bf16_bits(f_.ex, image_name(j) + ".patches");
        if (int64_t(recorded.size()) == n && std::equal(recorded.begin(), recorded.end(), im.patches)) out.push_back(f_.embeds[size_t(j)]);
      }
      if (out.size() < size_t(&im - images.data()) + 1) fail("RecordedVision", "the patches of one of the fixture's images", "others");
    }
    return out;
  }

 private:
  const VisionFixture& f_;
  CpuExecutor cpu_;
};

// prepare_vl_inputs through the engine: each prompt's text and PNGs give the reference's tokens and
// image places; the session's prefill rows start from the reference's embeddings (text rows from
// the table, span rows its delimiters and recorded aligner rows) and carry its Engram hash ids, and
// so do the decode steps after it (prompt0's look back into its last span).
TEST(VisionParity, TheSessionFeedsTheReferencesInputs) {
  const VisionFixture f;
  const Config& c = f.config();
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir(kName) + "/tokenizer.json");
  const test::json prompts = test::json::parse(test::read_text(test::fixture_dir(kName) + "/prompts.json"))["prompts"];
  RecordedVision executor(f);
  const int64_t d = c.dim, per_row = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
  for (int i = 0; i < kPrompts; ++i) {
    const std::string p = f.prefix(i);
    std::vector<std::shared_ptr<const ImageInput>> images;
    for (const auto& png : prompts[size_t(i)]["images"]) {
      const std::vector<uint8_t> bytes = file_bytes(test::fixture_dir(kName) + "/" + png.get<std::string>());
      images.push_back(prepare_image(decode_image(bytes.data(), bytes.size()), c));
    }
    std::vector<PromptImage> placed;
    const std::vector<int> tokens = encode_with_images(tokenizer, prompts[size_t(i)]["text"].get<std::string>(), false, images, c, placed);
    EXPECT_EQ(tokens, f.tokens(i)) << p;
    std::vector<int64_t> starts;
    for (const PromptImage& im : placed) starts.push_back(im.start);
    EXPECT_EQ(starts, f.ex.ints(p + "image_start")) << p;

    Session session(executor, &tokenizer, Mode::Exact);
    session.begin_prompt(tokens, nullptr, std::nullopt, false, placed);
    const BatchItem item = session.next_chunk(int64_t(tokens.size()));
    const std::vector<float> embed = f.ex.floats(p + "prefill.embed");
    std::vector<float> row(static_cast<size_t>(d));
    int differing = 0;
    for (size_t r = 0; r < tokens.size(); ++r) {
      const float* ours = item.options.span_embeddings ? item.options.span_embeddings[r] : nullptr;
      if (!ours) {
        f.model->embed().row(tokens[r], row.data());
        ours = row.data();
      }
      differing += !std::equal(ours, ours + d, embed.begin() + int64_t(r) * d);
    }
    EXPECT_EQ(differing, 0) << p << ": rows whose embedding is not the reference's";
    const std::vector<int64_t> hashes = f.hashes(i);
    EXPECT_TRUE(std::equal(hashes.begin(), hashes.end(), item.engram_ids)) << p << " prefill Engram ids";
    executor.forward_batch({item});
    session.ran();
    const std::vector<int64_t> steps = f.ex.ints(p + "decode.tokens"), decode_hashes = f.hashes(i, true);
    for (size_t k = 0; k < steps.size(); ++k) {
      const BatchItem step = session.next_decode(int(steps[k]));
      EXPECT_TRUE(std::equal(step.engram_ids, step.engram_ids + per_row, decode_hashes.begin() + int64_t(k) * per_row))
          << p << " decode step " << k << " Engram ids";
      executor.forward_batch({step});
      session.ran();
    }
  }
}

// --- the text forward on the image prompts, on every executor ------------------------------------

// One suite for every executor (as forward_parity_test): tests/CMakeLists.txt registers the CPU
// executor's instance everywhere and the CUDA executor's, label gpu, where a GPU is. The CPU runs
// each check under the summation variants, its bound at least their spread; CUDA runs once, in its
// own kernels' order, under the same baseline figures. cpu2ranks: the CPU executor over the
// model cut in two (docs/parallel.md), its bound at least the spread over its orders and the whole
// model's.
class VisionExecutorParity : public testing::TestWithParam<std::string> {
 protected:
  bool cut() const { return GetParam() == "cpu2ranks_executor"; }
  Device device() const { return cut() ? Device::Cpu : parse_device(GetParam().substr(0, GetParam().find('_'))); }
  int variants() const { return device() == Device::Cpu ? test::kVariants : 1; }
  VisionFixture fixture() const {
    const Device d = device();
    const int ranks = cut() ? 2 : 1;
    return VisionFixture(
        test::executor_sequences([d, ranks](const Model& model) { return make_executor(model, d, std::nullopt, ranks); }));
  }
  std::optional<VisionFixture> whole() const {
    if (!cut()) return std::nullopt;
    return VisionFixture();
  }
};

// Forced: the reference's top-k and experts imposed (its experts on image rows are bias_vl's), each
// prompt within the baseline's forced_topk_routing figures (or the summation variants' spread).
TEST_P(VisionExecutorParity, ForcedChoices) {
  const VisionFixture f = fixture();
  const std::optional<VisionFixture> also = whole();
  for (int prompt = 0; prompt < kPrompts; ++prompt)
    test::expect_mode(f, "forced_topk_routing", {prompt}, variants(), also ? &*also : nullptr);
}

// Free: our own choices, both prompts pooled, within the baseline's free figures; every argmax
// (greedy token) that differs from the reference's on a row whose margin is a near-tie.
TEST_P(VisionExecutorParity, FreeChoices) {
  const VisionFixture f = fixture();
  const std::optional<VisionFixture> also = whole();
  test::expect_mode(f, "free", {0, 1}, variants(), also ? &*also : nullptr);
}

// The experts of image rows. Under forcing every call sees the reference's inputs up to rounding;
// our own picks (recorded beside the imposed ones) that differ from the reference's are near-ties
// (forward_fixture.h's bound); and on the image rows they are bias_vl's: where the text bias would
// pick otherwise (the fixture counts 73 of 120 such decisions in prompt0, 199 of 336 in prompt1),
// ours agree with bias_vl's on all but as many rows as the reference's own CUDA rerun differs
// (forced_topk: 6/120, 21/336), with headroom.
TEST_P(VisionExecutorParity, ImageRowsRouteWithBiasVl) {
  const VisionFixture f = fixture();
  const Config& c = f.config();
  const int k = c.n_activated_experts, L = c.n_layers;
  for (int i = 0; i < kPrompts; ++i) {
    const std::string p = f.prefix(i);
    std::vector<Trace> traces;
    f.run(i, true, 0, &traces);
    std::vector<int64_t> rows(traces.size(), 1);
    rows[0] = int64_t(f.tokens(i).size());
    test::ChoiceSource reference = [&](bool decode, int64_t first, int64_t n) { return f.recorded(i, decode, first, n); };
    test::expect_near_ties(f, test::choice_gaps(c, traces, rows, reference), f.name + " " + p);

    const std::vector<int64_t> types = f.ex.ints(p + "token_types"), vl = f.ex.ints(p + "prefill.route_experts"),
                               text = f.ex.ints(p + "prefill.route_experts_text_bias");
    const int64_t P = int64_t(types.size());
    int decisions = 0, bias_matters = 0, ours_vl = 0;
    auto set = [&](const std::vector<int64_t>& e, int l, int64_t r) {
      return std::set<int64_t>(e.begin() + (l * P + r) * k, e.begin() + (l * P + r + 1) * k);
    };
    for (int l = 0; l < L; ++l)
      for (int64_t r = 0; r < P; ++r) {
        if (types[size_t(r)] < 0) continue;
        const std::vector<int32_t>& mine = traces[0].route_experts[size_t(l)];
        const std::set<int64_t> ours(mine.begin() + r * k, mine.begin() + (r + 1) * k);
        ++decisions;
        bias_matters += set(vl, l, r) != set(text, l, r);
        ours_vl += ours == set(vl, l, r);
      }
    const std::string flips = f.base("forced_topk", i, "prefill.routing_decisions_differing_image_rows");
    const double reference_flips = std::stod(flips.substr(0, flips.find('/')));
    std::printf("%s image rows: %d decisions, bias_vl changes %d, ours agree with bias_vl's on %d (reference rerun differs on %s)\n",
                p.c_str(), decisions, bias_matters, ours_vl, flips.c_str());
    EXPECT_GE(bias_matters, decisions / 2) << "the fixture's image rows tell bias_vl from the text bias";
    EXPECT_GE(double(ours_vl), double(decisions) - test::kHeadroom * reference_flips) << p;
  }
}

std::vector<std::string> executors() {
  std::vector<std::string> e = {"cpu_executor", "cpu2ranks_executor"};
#ifdef DSV41_HAVE_CUDA
  e.push_back("cuda_executor");
#endif
  return e;
}

INSTANTIATE_TEST_SUITE_P(Executors, VisionExecutorParity, testing::ValuesIn(executors()),
                         [](const testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace dsv41
