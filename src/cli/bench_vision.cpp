// dsv41 bench vision [--model DIR | --preset NAME [--random-weights SEED]] [--width W] [--height H]
//                    [--images 1,8] [--prompt-tokens N] [--seed S] [--device auto|cpu|cuda] [--json]
//
// The image path's speed (issue 20) on the executor --device picks: synthetic W × H images (random
// pixels, so no decoder is timed) through the reference's preprocessing (the plan, the fit, the
// bf16 patches: ms per image), then the vision tower and the aligner in calls of each --images
// count (ms per image, images per second), then one prompt of N text tokens around one image's
// span prefilled (time to first token: the tower's share and the text layers' over the span) beside
// a text-only prompt of the same length. Without --model a random checkpoint of the preset (default
// small-vision: the released tower behind a small text model) is written to a temporary directory.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_dir.h"
#include "cli/progress.h"
#include "engine/prompt_image.h"
#include "engine/session.h"

namespace dsv41::cli {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

RgbImage random_image(int width, int height, std::mt19937_64& rng) {
  RgbImage image;
  image.width = width, image.height = height;
  image.pixels.resize(size_t(width) * size_t(height) * 3);
  for (uint8_t& v : image.pixels) v = uint8_t(rng());
  return image;
}

}  // namespace

void add_bench_vision(CLI::App& bench) {
  struct Args {
    std::string model, preset = "small-vision", images = "1,8";
    int width = 640, height = 480, prompt_tokens = 256;
    uint64_t seed = 1;
    std::optional<uint64_t> random_weights;
    bool as_json = false;
    Device device = Device::Auto;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand("vision", "Image preprocessing, the vision tower per image, and prefill with an image");
  auto* model = cmd->add_option("--model", args->model, "Checkpoint directory with a vision tower (default: a random checkpoint of --preset)");
  cmd->add_option("--preset", args->preset, "Config of the random checkpoint")->excludes(model);
  cmd->add_option("--width", args->width, "Width of the synthetic images")->check(CLI::Range(1, 8192));
  cmd->add_option("--height", args->height, "Height of the synthetic images")->check(CLI::Range(1, 8192));
  cmd->add_option("--images", args->images, "Images per call of the vision tower, e.g. 1,8");
  cmd->add_option("--prompt-tokens", args->prompt_tokens, "Text tokens around the image in the prefill")->check(CLI::Range(2, 1 << 16));
  cmd->add_option("--seed", args->seed, "Seed of the random checkpoint, the pixels and the prompts");
  cmd->add_option("--random-weights", args->random_weights,
                  "Seed: the preset's layout only on disk, its weights random on the GPU (CUDA executor; sizes no disk holds)")
      ->excludes(model);
  cmd->add_flag("--json", args->as_json, "Print one JSON object");
  add_device_flag(*cmd, args->device);
  cmd->callback([args] {
    const std::vector<int> counts = parse_int_list(args->images, "--images", "image counts", 1, 256);
    const BenchCheckpoint checkpoint("vision", args->model, args->preset, args->seed, args->as_json, args->random_weights.has_value());
    ModelDir m = load_model_dir(checkpoint.dir(), args->device, args->random_weights);
    const Config& c = m.model->config();
    if (!c.has_vision()) fail(checkpoint.dir(), "a checkpoint with a vision tower", "none");
    if (!m.executor->takes_images())
      fail("bench vision", "an executor with the vision tower (--device cpu or cuda)", m.executor->name());
    std::mt19937_64 rng(args->seed);
    Progress progress(stderr_is_terminal() && !args->as_json);
    const int most = *std::max_element(counts.begin(), counts.end());

    // Preprocessing, one image at a time.
    std::vector<std::shared_ptr<const ImageInput>> inputs;
    double preprocess_ms = 0;
    for (int i = 0; i < most; ++i) {
      const RgbImage image = random_image(args->width, args->height, rng);
      const auto t0 = Clock::now();
      inputs.push_back(prepare_image(image, c));
      preprocess_ms += ms_since(t0);
    }
    const ImagePlan& plan = inputs.front()->plan;

    // The tower: a call per count, its images stacked.
    nlohmann::json tower = nlohmann::json::array();
    for (size_t k = 0; k < counts.size(); ++k) {
      progress.update(fmt::format("bench vision: {} image(s) a call", counts[k]), int64_t(k), int64_t(counts.size()) + 1);
      std::vector<VisionImage> batch;
      for (int i = 0; i < counts[k]; ++i)
        batch.push_back({inputs[size_t(i)]->patches.data(), inputs[size_t(i)]->plan.n_vit_h, inputs[size_t(i)]->plan.n_vit_w});
      const auto t0 = Clock::now();
      m.executor->encode_images(batch);
      const double ms = ms_since(t0);
      tower.push_back({{"images", counts[k]}, {"ms", ms}, {"ms_per_image", ms / counts[k]}, {"images_per_s", 1e3 * counts[k] / ms}});
    }

    // Prefill: text, the image's span, text; beside it a text-only prompt of the same length.
    progress.update("bench vision: prefill", int64_t(counts.size()), int64_t(counts.size()) + 1);
    std::uniform_int_distribution<int> id(3, int(sampling_vocab(c, m.tokenizer_or_null())) - 1);
    const int64_t before = args->prompt_tokens / 2, span = plan.span_tokens();
    std::vector<int> prompt, text;
    for (int64_t i = 0; i < args->prompt_tokens + span; ++i) {
      text.push_back(id(rng));
      prompt.push_back(i >= before && i < before + span ? int(c.image_token_id) : text.back());
    }
    const std::vector<PromptImage> placed = {PromptImage{before, inputs.front()}};
    auto prefill_ms = [&](const std::vector<int>& tokens, std::span<const PromptImage> images) {
      Session s(*m.executor, m.tokenizer_or_null(), Mode::Default);
      const auto t0 = Clock::now();
      s.prefill(tokens, images);
      return ms_since(t0);
    };
    const double with_image = prefill_ms(prompt, placed), text_only = prefill_ms(text, {});
    progress.clear();

    nlohmann::json out = {{"model", checkpoint.dir()},
                          {"executor", m.executor->name()},
                          {"image", {{"width", args->width}, {"height", args->height}, {"fitted_width", plan.best_width},
                                     {"fitted_height", plan.best_height}, {"patches", plan.patches()},
                                     {"span_tokens", span}}},
                          {"preprocess_ms_per_image", preprocess_ms / most},
                          {"tower", tower},
                          {"prefill", {{"prompt_tokens", int64_t(prompt.size())}, {"image_tokens", span},
                                       {"ms", with_image}, {"text_only_ms", text_only}}}};
    if (args->as_json) {
      fmt::print("{}\n", out.dump());
      return;
    }
    fmt::print("{} × {} images → {} × {}: {} patches, a span of {} tokens; preprocessing {:.1f} ms an image\n\n", args->width,
               args->height, plan.best_width, plan.best_height, plan.patches(), span, preprocess_ms / most);
    fmt::print("| images a call | ms | ms per image | images/s |\n| ---: | ---: | ---: | ---: |\n");
    for (const nlohmann::json& t : tower)
      fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} |\n", t["images"].get<int>(), t["ms"].get<double>(), t["ms_per_image"].get<double>(),
                 t["images_per_s"].get<double>());
    fmt::print("\nprefill of {} tokens with one image ({} of them its span): {:.1f} ms; text only, same length: {:.1f} ms\n",
               prompt.size(), span, with_image, text_only);
  });
}

}  // namespace dsv41::cli
