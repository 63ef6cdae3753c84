// dsv41 train --config FILE [--out DIR] [--steps N] [--device cpu|cuda]
// dsv41 train --resume DIR [--steps N] [--device cpu|cuda]
//
// Trains a model of the V4.1 architecture on the data of `dsv41 data build` (docs/training.md,
// "dsv41 train"): a progress bar on stderr when it is a terminal (step, loss, DSpark's loss,
// tokens/s, ETA), a line per log interval (above the bar, or on stdout when stderr is not a
// terminal), log.jsonl and the checkpoints in the output directory.
#include <fmt/core.h>

#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "cli/progress.h"
#include "train/trainer/trainer.h"

namespace dsv41::cli {

namespace {

std::string duration_text(double seconds) {
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s / 60 % 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

void add_train(CLI::App& app) {
  struct Args {
    std::string config, resume, out, device = "cpu";
    int64_t steps = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model of the V4.1 architecture on `dsv41 data build` data (docs/training.md)");
  auto* config = cmd->add_option("--config", args->config, "Training configuration (JSON): model, data, hyper-parameters");
  auto* resume = cmd->add_option("--resume", args->resume, "Continue the run in this output directory from its newest checkpoint")
                     ->excludes(config);
  config->excludes(resume);
  cmd->add_option("--out", args->out, "Output directory, instead of the configuration's \"out\"")->excludes(resume);
  cmd->add_option("--steps", args->steps, "The run's total steps, instead of the configuration's")
      ->check(CLI::PositiveNumber)
      ->default_str("");
  cmd->add_option("--device", args->device,
                  "Where the steps run: cpu, or cuda (the CUDA trainer, a step's sequences as one batch; docs/training.md)")
      ->capture_default_str();
  cmd->callback([args] {
    if (args->config.empty() && args->resume.empty()) throw CLI::RequiredError("--config or --resume");
    const train::TrainDevice device = train::train_device_from_name(args->device);
    std::unique_ptr<train::Trainer> trainer;
    const std::optional<int64_t> steps = args->steps > 0 ? std::optional<int64_t>(args->steps) : std::nullopt;
    if (!args->resume.empty()) {
      trainer = train::Trainer::resume(args->resume, steps, device);
    } else {
      train::TrainConfig cfg = train::load_train_config(args->config);
      if (!args->out.empty()) cfg.out_dir = std::filesystem::absolute(args->out).lexically_normal().string();
      if (steps) cfg.steps = *steps;
      trainer = train::Trainer::start(std::move(cfg), device);
    }
    const train::TrainConfig& c = trainer->config();
    fmt::print("{} a model of {} layers, dim {}, {} parameters: {} x {} tokens a step, steps {} to {}, into {}\n",
               args->resume.empty() ? "training" : "resuming", c.model.n_layers, c.model.dim, trainer->parameters().count(),
               c.batch_size, c.seq_len, trainer->step(), c.steps, c.out_dir);
    std::fflush(stdout);

    Progress progress;
    const bool bar = stderr_is_terminal();
    train::TrainEvents events;
    events.step = [&](const train::StepReport& r) {
      const std::string dspark = c.trains_dspark() ? fmt::format(" | DSpark {:.4f}", r.dspark_loss) : std::string();
      progress.update(fmt::format("train loss {:.4f}{} | {:.0f} tokens/s | ETA {}", r.loss, dspark, r.tokens_per_second,
                                  duration_text(r.eta_seconds)),
                      r.step, r.steps);
    };
    events.line = [&](const std::string& text) {
      if (bar) {
        progress.line(text);
      } else {
        fmt::print("{}\n", text);
        std::fflush(stdout);
      }
    };
    trainer->run(events);
    progress.clear();
    fmt::print("done: {} steps; the model is {}/latest (dsv41 serve --model {}/latest)\n", trainer->step(), c.out_dir, c.out_dir);
  });
}

}  // namespace dsv41::cli
