// dsv41 init-random --preset P --out DIR [--seed S] [--quantized]
#include <fmt/core.h>
#include <unistd.h>

#include "cli/commands.h"
#include "model/random_checkpoint.h"

namespace dsv41::cli {

void add_init_random(CLI::App& app) {
  struct Args {
    std::string preset, out;
    uint64_t seed = 0;
    bool quantized = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("init-random", "Write a checkpoint of random weights in the official layout");
  cmd->add_option("--preset", args->preset, "Embedded configuration: " + [] {
    std::string s;
    for (auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }())->required();
  cmd->add_option("--out", args->out, "Directory to create")->required();
  cmd->add_option("--seed", args->seed, "Random seed (values depend only on seed and tensor name)");
  cmd->add_flag("--quantized", args->quantized, "fp8 dense weights (32x32 ue8m0) and fp4 experts, as released");
  cmd->callback([args] {
    Config config = preset(args->preset);
    RandomCheckpointOptions opt;
    opt.seed = args->seed;
    opt.quantized = args->quantized;
    const bool tty = isatty(STDERR_FILENO);
    int last_percent = -1;
    opt.progress = [&](int64_t done, int64_t total) {
      int percent = int(100 * done / std::max<int64_t>(total, 1));
      if (!tty || percent == last_percent) return;
      last_percent = percent;
      fmt::print(stderr, "\rwriting {}: {:3d}% of {:.2f} GB", args->out, percent, double(total) / 1e9);
    };
    write_random_checkpoint(config, args->out, opt);
    if (tty) fmt::print(stderr, "\n");
    fmt::print("wrote {} ({}, {}, seed {})\n", args->out, config.source,
               args->quantized ? "fp8 dense + fp4 experts" : "bf16", args->seed);
  });
}

}  // namespace dsv41::cli
