// dsv41 init-random --preset P --out DIR [--seed S] [--quantized | --layout-only] [--tokenizer DIR] [--vocab N]
#include <fmt/core.h>

#include "cli/commands.h"
#include "cli/progress.h"
#include "model/random_checkpoint.h"

namespace dsv41::cli {

void add_init_random(CLI::App& app) {
  struct Args {
    std::string preset, out, tokenizer;
    uint64_t seed = 0;
    int64_t vocab = 0;
    bool quantized = false, layout_only = false;
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
  auto* quantized = cmd->add_flag("--quantized", args->quantized, "fp8 dense weights (32x32 ue8m0) and fp4 experts, as released");
  cmd->add_flag("--layout-only", args->layout_only,
                "The tensor layout only, as released, no values (a sparse file): for `dsv41 serve --random-weights`")
      ->excludes(quantized);
  cmd->add_option("--tokenizer", args->tokenizer,
                  "Directory with a Hugging Face tokenizer.json and tokenizer_config.json to ship instead of the "
                  "random tokenizer (at most vocab_size ids)");
  cmd->add_option("--vocab", args->vocab, "vocab_size instead of the preset's (rows of embed and head)")
      ->check(CLI::PositiveNumber)
      ->default_str("");
  cmd->callback([args] {
    Config config = preset(args->preset);
    if (args->vocab > 0) config.vocab_size = args->vocab;
    RandomCheckpointOptions opt;
    opt.seed = args->seed;
    opt.quantized = args->quantized;
    opt.tokenizer_dir = args->tokenizer;
    if (args->layout_only) {
      write_layout_checkpoint_with_tokenizer(config, args->out, opt);
      fmt::print("wrote {} ({}, vocab_size {}, the tensor layout only, {} tokenizer)\n", args->out, config.source,
                 config.vocab_size, args->tokenizer.empty() ? "random" : args->tokenizer + "'s");
      return;
    }
    Progress progress;
    opt.progress = [&](int64_t done, int64_t total) { progress.update("writing " + args->out, done, total, Progress::Unit::Bytes); };
    write_random_checkpoint(config, args->out, opt);
    progress.clear();
    fmt::print("wrote {} ({}, vocab_size {}, {}, seed {}, {} tokenizer)\n", args->out, config.source,
               config.vocab_size, args->quantized ? "fp8 dense + fp4 experts" : "bf16", args->seed,
               args->tokenizer.empty() ? "random" : args->tokenizer + "'s");
  });
}

}  // namespace dsv41::cli
