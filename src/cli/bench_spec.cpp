// dsv41 bench spec [--model DIR | --preset NAME] [--prompt-tokens N] [--tokens N] [--batches 1,4]
//                  [--temperature T] [--seed S] [--device auto|cpu|cuda] [--json]
//
// Speculative decoding's speed (issue 18) on the executor --device picks (auto: CUDA where a GPU
// is): output tokens per second of plain decoding and of DSpark speculation (greedy unless a
// temperature is given), each batch size's requests through the scheduler; and at batch 1 with an
// oracle drafter, whose drafts are the target's own greedy continuation (from a plain run, then
// as the verification passes emit it): every draft accepted, the ceiling of the verify path.
// Through the scheduler each step decides whether drafting pays (engine/prefix_schedule.h):
// random weights accept few of DSpark's drafts, so there its sequences soon decode plainly, and
// its figure is the cost of that decision (the steps that drafted, the probes), not speculation's
// gain. Each speculative run reports its steps that drafted and that decoded plainly, and the
// profiles its scheduler measured. Without --model a random checkpoint of the preset (default
// tiny) is written to a temporary directory first.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <random>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_dir.h"
#include "cli/progress.h"
#include "engine/scheduler.h"
#include "engine/session.h"

namespace dsv41::cli {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Run {
  std::string drafter;  // "none", "dspark", "oracle"
  int batch = 1;
  double tokens_per_s = 0;
  SpeculationStats spec;
  std::vector<StepRate::Point> verify_profile, plain_profile, draft_profile;  // the scheduler's (dspark)
  int oracle_rounds = 0;  // the oracle's runs until its drafts were all accepted
};

nlohmann::json to_json(const std::vector<StepRate::Point>& profile) {
  nlohmann::json j = nlohmann::json::array();
  for (const StepRate::Point& p : profile) j.push_back({p.rows, p.per_second});
  return j;
}

nlohmann::json to_json(const Run& r) {
  nlohmann::json j = {{"batch", r.batch}, {"drafter", r.drafter}, {"output_tokens_per_s", r.tokens_per_s}};
  if (r.drafter != "none") {
    j["speculative_steps"] = r.spec.steps;
    if (r.drafter == "dspark") {
      j["plain_steps"] = r.spec.plain_steps;
      j["verify_profile"] = to_json(r.verify_profile);  // [rows, passes/s]
      j["plain_profile"] = to_json(r.plain_profile);    // [sequences, decode passes/s]
      j["draft_profile"] = to_json(r.draft_profile);    // [sequences, drafting calls/s]
    }
    if (r.drafter == "oracle") j["oracle_rounds"] = r.oracle_rounds;
    j["mean_accepted"] = r.spec.steps > 0 ? double(r.spec.accepted) / double(r.spec.steps) : 0.0;
    j["accepted_at"] = r.spec.accepted_at;
  }
  return j;
}

// `batch` requests of `tokens` output tokens through a scheduler with speculation on or off: the
// output tokens over the wall time from the first submission to the last finish (prefills included).
Run through_scheduler(Executor& executor, const Tokenizer* tokenizer, const std::vector<std::vector<int>>& prompts, int tokens,
                      const SamplingParams& sampling, bool speculative) {
  SchedulerOptions options;
  options.max_running = int(prompts.size());
  options.speculative = speculative;
  Scheduler scheduler(executor, tokenizer, Mode::Default, nullptr, options);
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<Generation>> gens;
  for (const std::vector<int>& p : prompts) {
    GenerationRequest r;
    r.prompt = p;
    r.max_tokens = tokens;
    r.sampling = sampling;
    gens.push_back(scheduler.submit(r));
  }
  int64_t emitted = 0;
  for (auto& g : gens)
    for (GenerationEvent e = g->next(); e.kind != GenerationEvent::Kind::Finished; e = g->next())
      emitted += e.kind == GenerationEvent::Kind::Token;
  Run run;
  run.drafter = speculative ? "dspark" : "none";
  run.batch = int(prompts.size());
  run.tokens_per_s = double(emitted) / seconds_since(t0);
  run.spec = scheduler.stats().speculation;
  if (speculative) {
    run.verify_profile = scheduler.step_rate().points();
    run.plain_profile = scheduler.plain_rate().points();
    run.draft_profile = scheduler.draft_rate().points();
  }
  return run;
}

// Batch 1 with the oracle, `tokens` output tokens: each step drafts `known`'s next tokens after its
// anchor (`known` reaches a block past `tokens`), and every token the target emits is written into
// `known` at its place. The decode time alone is timed.
Run oracle_run(Executor& executor, const Tokenizer* tokenizer, const std::vector<int>& prompt, std::vector<int>& known, int tokens) {
  const Config& c = executor.model().config();
  Session s(executor, tokenizer, Mode::Default);
  s.enable_drafting();
  GreedyVerifier verifier(c.vocab_size, c.vocab_size);
  const int64_t P = int64_t(prompt.size());
  size_t i = 0;  // the anchor's place in `known`
  auto drafter = [&](int anchor) {
    Draft d{{anchor}, {}, {}};
    for (int j = 1; j <= c.dspark_block_size; ++j) d.tokens.push_back(known.at(i + size_t(j)));
    return d;
  };
  Run run;
  run.drafter = "oracle";
  const std::vector<float> logits = s.prefill(prompt);
  int next = draft_argmax(logits);
  known[0] = next;
  size_t emitted = 1;
  const auto t0 = Clock::now();
  while (emitted < size_t(tokens)) {
    i = size_t(s.length() - P);
    const Session::Speculation step = s.speculate(next, verifier, drafter);
    run.spec.steps += 1, run.spec.accepted += step.accepted, run.spec.drafted += int64_t(step.draft.size()) - 1;
    if (run.spec.accepted_at.size() < step.draft.size() - 1) run.spec.accepted_at.resize(step.draft.size() - 1, 0);
    for (int k = 0; k < step.accepted; ++k) run.spec.accepted_at[size_t(k)] += 1;
    for (size_t j = 0; j < step.emitted.size(); ++j) known.at(i + 1 + j) = step.emitted[j];
    emitted += step.emitted.size();
    next = step.emitted.back();
  }
  run.tokens_per_s = double(emitted - 1) / seconds_since(t0);
  return run;
}

// The oracle's ceiling: `known` starts as plain greedy decoding's reply, whose tokens a verification
// pass may not reproduce where the logits are near-flat (a pass of several rows sums in another
// order than a decode step: random weights over many layers tie at the last bits). Runs repeat,
// each drafting what the last one's passes emitted, until every draft of a run is accepted (each
// run repeats the steps before its first rejection and corrects that one, so where a row's logits do
// not depend on the rows after it in its pass, at most one run per token) or `rounds` runs; the
// last run is the figure, with the runs it took.
Run oracle(Executor& executor, const Tokenizer* tokenizer, const std::vector<int>& prompt, std::vector<int> known, int tokens,
           int rounds) {
  Run run;
  for (int r = 1; r <= rounds; ++r) {
    run = oracle_run(executor, tokenizer, prompt, known, tokens);
    run.oracle_rounds = r;
    if (run.spec.accepted == run.spec.drafted) break;
  }
  return run;
}

}  // namespace

void add_bench_spec(CLI::App& bench) {
  struct Args {
    std::string model, preset = "tiny", batches = "1,4";
    int prompt_tokens = 64, tokens = 64;
    uint64_t seed = 1;
    std::optional<uint64_t> random_weights;
    float temperature = 0;
    bool as_json = false;
    Device device = Device::Auto;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand("spec", "Output tokens/s with and without DSpark speculative decoding");
  auto* model = cmd->add_option("--model", args->model, "Checkpoint directory with DSpark stages (default: a random checkpoint of --preset)");
  cmd->add_option("--preset", args->preset, "Config of the random checkpoint")->excludes(model);
  cmd->add_option("--prompt-tokens", args->prompt_tokens, "Tokens of each request's prompt")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--tokens", args->tokens, "Output tokens of each request")->check(CLI::Range(2, 1 << 16));
  cmd->add_option("--batches", args->batches, "Concurrent requests, e.g. 1,4 (batch 1 also runs the oracle drafter)");
  cmd->add_option("--temperature", args->temperature, "Sampling temperature (0: greedy; the oracle runs greedy)")->check(CLI::Range(0.0, 2.0));
  cmd->add_option("--seed", args->seed, "Seed of the random checkpoint, the prompts and the sampling");
  cmd->add_option("--random-weights", args->random_weights,
                  "Seed: the preset's layout only on disk, its weights random on the GPU (CUDA executor; sizes no disk holds)")
      ->excludes(model);
  cmd->add_flag("--json", args->as_json, "Print one JSON object");
  add_device_flag(*cmd, args->device);
  cmd->callback([args] {
    const std::vector<int> batches = parse_int_list(args->batches, "--batches", "batch sizes", 1, 4096);
    const BenchCheckpoint checkpoint("spec", args->model, args->preset, args->seed, args->as_json,
                                     args->random_weights.has_value());
    const std::string& dir = checkpoint.dir();
    ModelDir m = load_model_dir(dir, args->device, args->random_weights);
    const Config& c = m.model->config();
    if (!c.has_dspark()) fail(dir, "a checkpoint with DSpark stages", "none");
    const Tokenizer* tokenizer = m.tokenizer_or_null();

    std::mt19937_64 rng(args->seed);
    std::uniform_int_distribution<int> id(3, int(sampling_vocab(c, tokenizer)) - 1);
    auto random_prompt = [&] {
      std::vector<int> v(static_cast<size_t>(args->prompt_tokens));
      for (int& t : v) t = id(rng);
      return v;
    };
    SamplingParams sampling;
    sampling.temperature = args->temperature;
    sampling.seed = args->seed;
    std::vector<Run> runs;
    // A step per run: plain and speculative per batch, and the oracle's at batch 1.
    const int64_t steps = 2 * int64_t(batches.size()) + std::count(batches.begin(), batches.end(), 1);
    Progress progress(stderr_is_terminal() && !args->as_json);
    auto ran = [&](int b) {
      if (!args->as_json) progress.line(fmt::format("bench spec: batch {} {}: {:.1f} output tokens/s", b, runs.back().drafter, runs.back().tokens_per_s));
    };
    for (const int b : batches) {
      std::vector<std::vector<int>> prompts;
      for (int i = 0; i < b; ++i) prompts.push_back(random_prompt());
      for (const bool speculative : {false, true}) {
        progress.update(fmt::format("bench spec: batch {}{}", b, speculative ? " speculative" : ""), int64_t(runs.size()), steps);
        runs.push_back(through_scheduler(*m.executor, tokenizer, prompts, args->tokens, sampling, speculative));
        ran(b);
      }
      if (b != 1) continue;
      progress.update("bench spec: batch 1 oracle", int64_t(runs.size()), steps);
      Session plain(*m.executor, tokenizer, Mode::Default);
      std::vector<int> want{draft_argmax(plain.prefill(prompts[0]))};
      while (int(want.size()) < args->tokens + c.dspark_block_size + 1) want.push_back(draft_argmax(plain.decode(want.back())));
      runs.push_back(oracle(*m.executor, tokenizer, prompts[0], want, args->tokens, args->tokens));
      ran(1);
    }
    progress.clear();

    nlohmann::json out = {{"model", dir}, {"executor", m.executor->name()}, {"block_size", c.dspark_block_size},
                          {"prompt_tokens", args->prompt_tokens}, {"output_tokens", args->tokens},
                          {"temperature", args->temperature}, {"runs", nlohmann::json::array()}};
    for (const Run& r : runs) out["runs"].push_back(to_json(r));
    if (args->as_json) {
      fmt::print("{}\n", out.dump());
      return;
    }
    fmt::print("| batch | drafter | output tokens/s | mean accepted of {} | steps drafted / plain |\n| ---: | --- | ---: | ---: | ---: |\n",
               c.dspark_block_size);
    for (const Run& r : runs)
      fmt::print("| {} | {} | {:.1f} | {} | {} |\n", r.batch, r.drafter, r.tokens_per_s,
                 r.drafter == "none" ? std::string("") : fmt::format("{:.2f}", r.spec.steps > 0 ? double(r.spec.accepted) / double(r.spec.steps) : 0.0),
                 r.drafter == "dspark" ? fmt::format("{} / {}", r.spec.steps, r.spec.plain_steps) : std::string(""));
  });
}

}  // namespace dsv41::cli
