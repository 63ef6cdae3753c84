// dsv41 inspect (--preset P | --model DIR) [--json] [--prompt-tokens N] [--ranks N]
//
// The model's accounting (docs/accounting.md): parameters, active parameters per token, KV bytes,
// and precision-weighted FLOPs; with --ranks, the weights' bytes each rank holds when the model is
// cut over N ranks as model.py cuts it (docs/parallel.md). With --model, the checkpoint's tensors are also checked against
// the config, so a missing or mis-shaped weight is reported here rather than at load time.
#include <fmt/core.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "model/accounting.h"
#include "model/checkpoint.h"
#include "model/partition.h"
#include "model/weights.h"

namespace dsv41::cli {

namespace {

using json = nlohmann::json;

std::string human(double x, const char* unit = "") {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (std::fabs(x) >= 1000 && i < 5) x /= 1000, ++i;
  return fmt::format("{:.2f} {}{}", x, prefixes[i], unit);
}

std::string context_name(int64_t ctx) {
  return ctx >= (1 << 20) ? fmt::format("{}M", ctx >> 20) : fmt::format("{}K", ctx >> 10);
}

// Runs of consecutive layers with the same kind and ratio, e.g. "3-7 Reuse m=2".
std::vector<std::string> schedule(const Config& c) {
  std::vector<std::string> runs;
  int start = 0;
  auto label = [&](int l) {
    std::string s = l >= c.n_layers ? "DSpark" : layer_kind_name(c.layer_kind(l));
    if (c.compress_ratios[l] > 0) s += fmt::format(" m={}", c.compress_ratios[l]);
    if (c.candidate_source_layer == l) s += " (candidate source)";
    return s;
  };
  for (int l = 1; l <= c.n_total_layers(); ++l) {
    if (l < c.n_total_layers() && label(l) == label(start)) continue;
    runs.push_back((l - 1 == start ? fmt::format("{}", start) : fmt::format("{}-{}", start, l - 1)) + " " + label(start));
    start = l;
  }
  return runs;
}

json to_json(const Config& c, const Accounting& a) {
  json j;
  j["model"] = {{"source", c.source},        {"n_layers", c.n_layers},           {"n_mtp_layers", c.n_mtp_layers},
                {"dim", c.dim},              {"vocab_size", c.vocab_size},       {"dtype", c.dtype},
                {"expert_dtype", c.expert_dtype ? json(*c.expert_dtype) : json(nullptr)},
                {"decoder_start", c.decoder_start()}};
  json layers = json::array();
  for (int l = 0; l < c.n_total_layers(); ++l)
    layers.push_back({{"id", l}, {"kind", l >= c.n_layers ? "DSpark" : layer_kind_name(c.layer_kind(l))},
                      {"ratio", c.compress_ratios[l]}});
  j["model"]["layers"] = layers;
  j["params"] = {{"backbone", a.params.backbone},
                 {"engram", a.params.engram},
                 {"dspark", a.params.dspark},
                 {"vision", a.params.vision},
                 {"total", a.params.total()},
                 {"active_prefill", a.params.active_prefill},
                 {"active_prefill_exact", a.params.active_prefill_exact},
                 {"active_decode", a.params.active_decode}};
  double g = a.kv.global_bytes_per_token;
  j["kv"] = {{"global_bytes_per_token", g == std::floor(g) ? json(int64_t(g)) : json(g)},
             {"swa_bytes_per_sequence", a.kv.swa_bytes_per_sequence},
             {"main_entry_bytes", a.kv.main_entry_bytes},
             {"index_entry_bytes", a.kv.index_entry_bytes},
             {"swa_entry_bytes", a.kv.swa_entry_bytes}};
  json per_token = json::object();
  for (auto& p : a.decode) per_token[std::to_string(p.context)] = p.flops;
  j["decode_flops"] = {{"per_token", per_token}, {"ratio_1m_4k", a.decode_ratio_1m_4k}};
  j["prefill_flops"] = {{"prompt_tokens", a.prefill.prompt_tokens},
                        {"exact", a.prefill.exact_flops},
                        {"default", a.prefill.default_flops},
                        {"default_over_exact", a.prefill.default_over_exact()}};
  return j;
}

void print_text(const Config& c, const Accounting& a) {
  fmt::print("model       {}\n", c.source);
  fmt::print("shape       {} layers + {} DSpark, dim {}, {} heads x {}, vocab {}, weights {}{}\n", c.n_layers,
             c.has_dspark() ? c.n_mtp_layers : 0, c.dim, c.n_heads, c.head_dim, c.vocab_size, c.dtype,
             c.expert_dtype ? " / experts " + *c.expert_dtype : "");
  std::string runs;
  for (auto& r : schedule(c)) runs += (runs.empty() ? "" : ", ") + r;
  fmt::print("schedule    {}\n", runs);
  fmt::print("            CED decoder starts at layer {}\n", c.decoder_start());
  fmt::print("parameters  backbone {}  engram {}  dspark {}  vision {}  total {}\n", human(double(a.params.backbone)),
             human(double(a.params.engram)), human(double(a.params.dspark)), human(double(a.params.vision)),
             human(double(a.params.total())));
  fmt::print("active      prefill {} per token (default; exact {})  decode {} per token\n",
             human(double(a.params.active_prefill)), human(double(a.params.active_prefill_exact)),
             human(double(a.params.active_decode)));
  fmt::print("kv          global {} B/token (main {} B + index key {} B per entry)  SWA {} per sequence\n",
             a.kv.global_bytes_per_token, a.kv.main_entry_bytes, a.kv.index_entry_bytes,
             human(double(a.kv.swa_bytes_per_sequence), "B"));
  std::string decode;
  for (auto& p : a.decode) decode += fmt::format("{}: {}  ", context_name(p.context), human(p.flops, "FLOP"));
  fmt::print("decode      {}(1M / 4K = {:.3f})\n", decode, a.decode_ratio_1m_4k);
  fmt::print("prefill     {} tokens: default {}  exact {}  default / exact = {:.3f}\n", a.prefill.prompt_tokens,
             human(a.prefill.default_flops, "FLOP"), human(a.prefill.exact_flops, "FLOP"),
             a.prefill.default_over_exact());
}

}  // namespace

void add_inspect(CLI::App& app) {
  struct Args {
    std::string preset, model;
    bool json = false;
    int64_t prompt_tokens = 32768;
    int ranks = 0;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("inspect", "Parameters, KV bytes and FLOPs of a model (docs/accounting.md)");
  auto* p = cmd->add_option("--preset", args->preset, "Embedded configuration: deepseek-v4.1-flash, bench-1gpu, tiny");
  auto* m = cmd->add_option("--model", args->model, "Checkpoint directory (config.json + safetensors)");
  p->excludes(m);
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_option("--prompt-tokens", args->prompt_tokens, "Prompt length N for the prefill FLOPs")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 24));
  cmd->add_option("--ranks", args->ranks, "Also the weights' bytes each of N ranks holds (model.py's cut; docs/parallel.md)")
      ->check(CLI::Range(1, 4096));
  cmd->callback([args] {
    if (args->preset.empty() && args->model.empty()) fail("inspect", "--preset P or --model DIR", "neither");
    Config config = args->model.empty() ? preset(args->preset) : load_config(args->model);
    int64_t checkpoint_bytes = -1;
    size_t checkpoint_tensors = 0;
    if (!args->model.empty()) {
      Checkpoint ckpt = Checkpoint::open(args->model);
      check_weights(config, ckpt);
      checkpoint_bytes = 0;
      for (const std::string& name : ckpt.names()) checkpoint_bytes += int64_t(ckpt.get(name).nbytes);
      checkpoint_tensors = ckpt.size();
    }
    Accounting a = account(config, args->prompt_tokens);
    // Every rank of model.py's cut holds as much as rank 0 but for the Engram tables' last rows
    // (ceil(rows / N) a rank): the largest rank is rank 0.
    std::vector<RankBytes> ranks;
    if (args->ranks > 0) {
      check_partition(config, {0, args->ranks});
      for (int r = 0; r < args->ranks; ++r) ranks.push_back(rank_weight_bytes(config, {r, args->ranks}));
    }
    if (args->json) {
      json j = to_json(config, a);
      if (checkpoint_bytes >= 0) j["checkpoint"] = {{"tensors", checkpoint_tensors}, {"bytes", checkpoint_bytes}};
      if (!ranks.empty()) {
        json per = json::array();
        for (const RankBytes& b : ranks)
          per.push_back({{"backbone", b.backbone}, {"engram", b.engram}, {"dspark", b.dspark}, {"vision", b.vision}, {"total", b.total()}});
        j["ranks"] = {{"world", args->ranks}, {"weight_bytes", per}};
      }
      fmt::print("{}\n", j.dump(2));
    } else {
      print_text(config, a);
      if (checkpoint_bytes >= 0)
        fmt::print("checkpoint  {} tensors, {}, every one as the config expects\n", checkpoint_tensors,
                   human(double(checkpoint_bytes), "B"));
      if (!ranks.empty()) {
        const RankBytes& b = ranks.front();
        fmt::print("per rank    {} ranks (model.py's cut): rank 0 holds backbone {}  engram {}  dspark {}  vision {}  total {}\n",
                   args->ranks, human(double(b.backbone), "B"), human(double(b.engram), "B"), human(double(b.dspark), "B"),
                   human(double(b.vision), "B"), human(double(b.total()), "B"));
      }
    }
  });
}

}  // namespace dsv41::cli
