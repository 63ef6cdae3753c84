// dsv41 bench cache [--model DIR | --preset NAME] [--document-tokens N] [--question-tokens N]
//                   [--reply-tokens N] [--json]
//
// The KV cache's scenarios, each a prompt's time to first token and the tokens it computed, in
// default mode and in exact mode (whose global hits replay every layer over exact_replay_rows):
//   cold                 a document and a question, nothing cached
//   global_swa_hit       the next turn within the SWA TTL: blocks + SWA tail, exact continuation
//   global_hit_swa_miss  the same turn after the TTL: blocks, encoder bounded replay over W (exact
//                        mode: every layer's exact replay)
//   host_hit             a new conversation on the same document: its blocks from the host cache
//   disk_hit             after a restart (a new cache over the same store): blocks from disk
// and the KV bytes per token measured on the sequence's buffers. Without --model, a random
// checkpoint of the preset (default flash-kv: V4.1-Flash's KV shapes at small widths) is written
// to a temporary directory first.
#include <fmt/core.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "backend/cpu/sampling.h"
#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_dir.h"
#include "cli/progress.h"
#include "engine/session.h"
#include "kv/checkpoint_identity.h"
#include "kv/prefix_key.h"

namespace dsv41::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Workload {
  std::vector<int> document, q1, q2, q3, u2;
  int reply_tokens = 0;
};

std::vector<int> cat(std::initializer_list<const std::vector<int>*> parts) {
  std::vector<int> out;
  for (const std::vector<int>* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

struct Row {
  std::string name;
  double ttft_ms = 0;
  PrefixUse use;
};

struct Measured {
  std::vector<Row> rows;
  Session::Work cold_work;        // the cold prompt's encoder / decoder rows
  int64_t global_bytes = 0;       // the cold sequence's global KV buffers
  int64_t swa_bytes = 0;          // and its SWA rings
  int64_t tokens = 0;             // over this many tokens
};

// The scenarios of one mode: run_scenarios' timed() calls.
constexpr int kScenarios = 5;

// Every scenario in one mode, over a fresh cache with its persistent store in `store_dir`: each a
// step of `progress` (from `step`, of both modes' scenarios), and its line on stderr with `lines`.
Measured run_scenarios(const ModelDir& m, const Workload& w, Mode mode, const std::string& store_dir, Progress& progress, int step,
                       bool lines) {
  const Config& c = m.model->config();
  ManualClock swa_clock(0);
  KvCacheOptions options;
  options.fingerprint = "checkpoint " + checkpoint_identity(m.dir);
  options.mode = mode_name(mode);
  options.store_dir = store_dir;
  options.swa.clock = &swa_clock;
  auto cache = std::make_unique<KvCache>(c, options);

  Measured out;
  auto timed = [&](const std::string& name, Session& s, const std::vector<int>& prompt) {
    progress.update(fmt::format("bench cache: {} {}", mode_name(mode), name), step++, 2 * kScenarios);
    Row row{name, 0, {}};
    const auto t0 = Clock::now();
    std::vector<float> logits = s.prefill_prompt(prompt, cache.get(), &row.use);
    Sampler(SamplingParams{}).sample(logits.data(), sampling_vocab(c, m.tokenizer_or_null()));
    row.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    out.rows.push_back(row);
    if (lines)
      progress.line(fmt::format("  {:<8} {:<20} {:>9.1f} ms  computed {:>6}  cached {:>6}  replayed {:>4}", mode_name(mode), name,
                                row.ttft_ms, row.use.computed(), row.use.cached(), row.use.replayed));
    return logits;
  };

  Session a(*m.executor, m.tokenizer_or_null(), mode);
  const std::vector<int> p1 = cat({&w.document, &w.q1});
  std::vector<float> logits = timed("cold", a, p1);
  out.cold_work = a.work();
  out.global_bytes = a.state().global_kv_bytes();
  out.swa_bytes = a.state().window_bytes();
  out.tokens = a.length();
  std::vector<int> conversation = p1;
  Sampler greedy(SamplingParams{});
  for (int k = 0; k < w.reply_tokens; ++k) {
    conversation.push_back(greedy.sample(logits.data(), sampling_vocab(c, m.tokenizer_or_null())));
    logits = a.decode(conversation.back());
  }
  a.save(*cache);
  const std::vector<int> p2 = cat({&conversation, &w.u2});

  Session b(*m.executor, m.tokenizer_or_null(), mode);
  timed("global_swa_hit", b, p2);
  swa_clock.advance_ms(options.swa.ttl_ms);
  Session d(*m.executor, m.tokenizer_or_null(), mode);
  timed("global_hit_swa_miss", d, p2);
  Session e(*m.executor, m.tokenizer_or_null(), mode);
  timed("host_hit", e, cat({&w.document, &w.q2}));
  cache.reset();  // the restart: host cache and SWA pool gone, the store reopened by scanning
  cache = std::make_unique<KvCache>(c, options);
  Session f(*m.executor, m.tokenizer_or_null(), mode);
  timed("disk_hit", f, cat({&w.document, &w.q3}));
  return out;
}

}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  add_bench_serve(*bench);
  add_bench_spec(*bench);
  add_bench_vision(*bench);

  struct Args {
    std::string model, preset = "flash-kv";
    int document_tokens = 1024, question_tokens = 64, reply_tokens = 16;
    uint64_t seed = 1;
    bool as_json = false;
    Device device = Device::Auto;
    int ranks = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench->add_subcommand("cache", "Time to first token and work per KV-cache scenario, default vs exact mode");
  auto* model = cmd->add_option("--model", args->model, "Checkpoint directory (default: a random checkpoint of --preset)");
  cmd->add_option("--preset", args->preset, "Config of the random checkpoint")->excludes(model);
  cmd->add_option("--document-tokens", args->document_tokens, "Tokens of the shared document")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--question-tokens", args->question_tokens, "Tokens of each question and follow-up")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--reply-tokens", args->reply_tokens, "Tokens generated for the first turn")->check(CLI::Range(0, 1 << 16));
  cmd->add_option("--seed", args->seed, "Seed of the random checkpoint and the random prompts");
  cmd->add_flag("--json", args->as_json, "Print one JSON object");
  add_device_flag(*cmd, args->device, &args->ranks);
  cmd->callback([args] {
    const BenchCheckpoint checkpoint("cache", args->model, args->preset, args->seed, args->as_json);
    const std::string& dir = checkpoint.dir();
    const fs::path& scratch = checkpoint.scratch();
    ModelDir m = load_model_dir(dir, args->device, std::nullopt, args->ranks);
    const Config& c = m.model->config();

    // Prompts of random ids above the tokenizer's specials (0..2 in DeepSeek's layout).
    std::mt19937_64 rng(args->seed);
    std::uniform_int_distribution<int> id(3, int(sampling_vocab(c, m.tokenizer_or_null())) - 1);
    auto random_ids = [&](int n) {
      std::vector<int> v(static_cast<size_t>(n));
      for (int& t : v) t = id(rng);
      return v;
    };
    Workload w;
    w.document = random_ids(args->document_tokens);
    w.q1 = random_ids(args->question_tokens);
    w.q2 = random_ids(args->question_tokens);
    w.q3 = random_ids(args->question_tokens);
    w.u2 = random_ids(args->question_tokens);
    w.reply_tokens = args->reply_tokens;

    Progress progress(stderr_is_terminal() && !args->as_json);
    const Measured def = run_scenarios(m, w, Mode::Default, (scratch / "store-default").string(), progress, 0, !args->as_json);
    const Measured exact = run_scenarios(m, w, Mode::Exact, (scratch / "store-exact").string(), progress, kScenarios, !args->as_json);
    progress.clear();

    const int ds = c.decoder_start(), n = c.n_layers;
    auto layer_rows = [&](const Session::Work& wk) { return double(wk.encoder_tokens) * ds + double(wk.decoder_tokens) * (n - ds); };
    const double work_ratio = layer_rows(def.cold_work) / layer_rows(exact.cold_work);
    const double time_ratio = def.rows[0].ttft_ms / exact.rows[0].ttft_ms;
    const double bytes_per_token = double(def.global_bytes) / double(def.tokens);

    nlohmann::json records = nlohmann::json::array();
    for (size_t i = 0; i < def.rows.size(); ++i) {
      const Row& r = def.rows[i];
      const Row& e = exact.rows[i];
      records.push_back({{"name", r.name},
                         {"ttft_ms", r.ttft_ms},
                         {"tokens_computed", r.use.computed()},
                         {"tokens_cached", r.use.cached()},
                         {"tokens_replayed", r.use.replayed},
                         {"host_blocks", r.use.host_blocks},
                         {"disk_blocks", r.use.disk_blocks},
                         {"exact_ttft_ms", e.ttft_ms},
                         {"exact_tokens_computed", e.use.computed()},
                         {"exact_tokens_cached", e.use.cached()},
                         {"exact_tokens_replayed", e.use.replayed}});
    }
    if (args->as_json) {
      nlohmann::json out = {{"model", args->model.empty() ? "random " + args->preset : args->model},
                            {"device", m.executor->name()},
                            {"document_tokens", args->document_tokens},
                            {"question_tokens", args->question_tokens},
                            {"reply_tokens", args->reply_tokens},
                            {"block_tokens", block_tokens(c)},
                            {"window", c.window_size},
                            {"kv_bytes_per_token", bytes_per_token},
                            {"swa_bytes_per_sequence", def.swa_bytes},
                            {"prefill_work_ratio_default_exact", work_ratio},
                            {"prefill_time_ratio_default_exact", time_ratio},
                            {"scenarios", records}};
      fmt::print("{}\n", out.dump());
      return;
    }
    fmt::print("{:<20} {:>10} {:>9} {:>7} {:>8} {:>12} {:>14} {:>14}\n", "scenario", "ttft ms", "computed", "cached", "replayed",
               "exact ttft", "exact computed", "exact replayed");
    for (const nlohmann::json& r : records)
      fmt::print("{:<20} {:>10.1f} {:>9} {:>7} {:>8} {:>12.1f} {:>14} {:>14}\n", r["name"].get<std::string>(), r["ttft_ms"].get<double>(),
                 r["tokens_computed"].get<int64_t>(), r["tokens_cached"].get<int64_t>(), r["tokens_replayed"].get<int64_t>(),
                 r["exact_ttft_ms"].get<double>(), r["exact_tokens_computed"].get<int64_t>(),
                 r["exact_tokens_replayed"].get<int64_t>());
    fmt::print("global KV {:.1f} B/token over {} tokens (measured on the sequence's buffers); SWA {} B per sequence\n",
               bytes_per_token, def.tokens, def.swa_bytes);
    fmt::print("cold prefill, default / exact: {:.3f} of the layer-rows, {:.3f} of the time\n", work_ratio, time_ratio);
  });
}

}  // namespace dsv41::cli
