// dsv41 eval --model DIR --data DATA_DIR [--exact] [--kv-fp8] [--tokens N] [--seq-len L]
//            [--prompt-fraction F | --prompt-tokens P] [--passkey LENGTHS] [--passkey-trials K]
//            [--dspark] [--dspark-tokens N] [--seed S] [--json] [--device auto|cpu|cuda]
//
// What the engine's approximations cost on a trained model (issue 19, docs/eval.md): the served
// validation loss in the mode asked (default: decoder bounded replay; --exact), beside one exact
// pass's loss of the same tokens; the passkey retrieval probe at each --passkey length; DSpark's
// acceptance on validation prompts (--dspark). --kv-fp8 keeps the compressed global KV in SWA-FP8
// instead of KV-FP4 (CPU executor only).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_dir.h"
#include "cli/progress.h"
#include "eval/dspark_acceptance.h"
#include "eval/passkey.h"
#include "eval/served_loss.h"
#include "eval/validation_data.h"

namespace dsv41::cli {

// Tokens of a passkey reply: a 5-digit key and what surrounds it.
constexpr int kPasskeyReplyTokens = 8;

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double mean(double sum, int64_t n) { return n > 0 ? sum / double(n) : 0.0; }

// The passkey filler: the validation documents' text, joined by blank lines, encoded until it holds
// `want` ids (passkey_prompt repeats it when the split is shorter).
std::vector<int> filler_ids(const Tokenizer& tokenizer, const std::vector<std::string>& texts, int64_t want) {
  std::vector<int> ids;
  for (size_t i = 0; i < texts.size() && int64_t(ids.size()) < want; ++i) {
    const std::vector<int> d = tokenizer.encode((i == 0 ? "" : "\n\n") + texts[i], /*add_special_tokens=*/false);
    ids.insert(ids.end(), d.begin(), d.end());
  }
  return ids;
}

}  // namespace

void add_eval(CLI::App& app) {
  struct Args {
    std::string model, data, passkey;
    bool exact = false, kv_fp8 = false, dspark = false, as_json = false;
    int64_t tokens = 8192, seq_len = 512, prompt_tokens = 0, dspark_tokens = 64;
    double prompt_fraction = 0.5;
    int passkey_trials = 5;
    uint64_t seed = 1;
    Device device = Device::Auto;
    int ranks = 1;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("eval", "Measure a model: served validation loss, passkey retrieval, DSpark acceptance");
  cmd->add_option("--model", args->model, "Checkpoint directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--data", args->data, "Data directory of dsv41 data build (validation.tokens, validation.jsonl, tokenizer.json)")
      ->required();
  cmd->add_flag("--exact", args->exact,
                "Exact mode: every layer on every prompt position (default: decoder bounded replay, the decoder on the "
                "prompt's last window only)");
  cmd->add_flag("--kv-fp8", args->kv_fp8,
                "Keep the compressed global KV in SWA-FP8 (e4m3, ue8m0 per 32) instead of KV-FP4 (CPU executor only)");
  cmd->add_option("--tokens", args->tokens, "Validation tokens whose sequences the served loss scores (the first N of the file)");
  cmd->add_option("--seq-len", args->seq_len, "Length L of each validation sequence (L inputs, scored up to its next token)");
  auto* fraction = cmd->add_option("--prompt-fraction", args->prompt_fraction, "The prompt's share of each sequence (P = round(F·L))");
  auto* prompt = cmd->add_option("--prompt-tokens", args->prompt_tokens, "The prompt's length P in tokens (instead of a fraction)");
  fraction->excludes(prompt);
  cmd->add_option("--passkey", args->passkey, "Passkey probe lengths in tokens, e.g. 256,1024,4096 (none: no probe)");
  cmd->add_option("--passkey-trials", args->passkey_trials, "Passkey trials per length")->check(CLI::Range(1, 100000));
  cmd->add_flag("--dspark", args->dspark, "Also measure DSpark's greedy acceptance on each sequence's prompt");
  cmd->add_option("--dspark-tokens", args->dspark_tokens, "Tokens DSpark decodes after each prompt")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--seed", args->seed, "Seed of the passkey keys and depths");
  cmd->add_flag("--json", args->as_json, "Print one JSON object (docs/eval.md)");
  add_device_flag(*cmd, args->device, &args->ranks);
  cmd->callback([args] {
    if (args->seq_len < 1) fail("--seq-len", "at least 1 token", std::to_string(args->seq_len));
    if (args->tokens < args->seq_len + 1)
      fail("--tokens", "at least " + std::to_string(args->seq_len + 1) + " (one sequence of --seq-len " + std::to_string(args->seq_len) + " and its next token)",
           std::to_string(args->tokens));
    const int64_t L = args->seq_len;
    const int64_t P = args->prompt_tokens > 0 ? args->prompt_tokens : std::llround(args->prompt_fraction * double(L));
    if (P < 1 || P > L)
      fail(args->prompt_tokens > 0 ? "--prompt-tokens" : "--prompt-fraction", "a prompt of 1 to " + std::to_string(L) + " tokens",
           std::to_string(P) + " tokens");
    const std::vector<int> lengths =
        args->passkey.empty() ? std::vector<int>{} : parse_int_list(args->passkey, "--passkey", "prompt lengths in tokens", 1, 1 << 30);
    if (args->kv_fp8 && args->device == Device::Cuda)
      fail("--kv-fp8", "the CPU executor (--device cpu or auto)", "--device cuda (its KV is KV-FP4 only)");
    if (args->kv_fp8 && args->ranks > 1)
      fail("--kv-fp8", "a whole model (--ranks 1): the ranks' KV is KV-FP4 only", "--ranks " + std::to_string(args->ranks));

    ModelDir m = load_model_dir(args->model, args->kv_fp8 ? Device::Cpu : args->device, std::nullopt, args->ranks);
    const Config& c = m.model->config();
    if (!m.tokenizer) fail(args->model, "a tokenizer.json (the data's tokenizer)", "none");
    const Tokenizer& tokenizer = *m.tokenizer;
    if (args->kv_fp8) m.executor = std::make_unique<CpuExecutor>(*m.model, GlobalKvFormat::Fp8);
    if (L > c.max_seq_len)
      fail("--seq-len", "at most the model's max_seq_len " + std::to_string(c.max_seq_len), std::to_string(L));
    // A request's prompt and reply together stay within max_seq_len, as the server asks of one.
    for (int n : lengths)
      if (n + kPasskeyReplyTokens > c.max_seq_len)
        fail("--passkey", "lengths up to the model's max_seq_len " + std::to_string(c.max_seq_len) + " less the reply's " +
                              std::to_string(kPasskeyReplyTokens) + " tokens",
             std::to_string(n));
    if (args->dspark && !c.has_dspark()) fail(args->model, "a checkpoint with DSpark stages for --dspark", "none");
    if (args->dspark && P + args->dspark_tokens + c.dspark_block_size > c.max_seq_len)
      fail("--dspark-tokens", "the prompt's " + std::to_string(P) + " tokens, the drafted tokens and a last block (" +
                                   std::to_string(c.dspark_block_size) + ") within max_seq_len " + std::to_string(c.max_seq_len),
           std::to_string(args->dspark_tokens));
    const eval::ValidationData data = eval::read_validation(args->data, c, tokenizer, !lengths.empty());
    const int64_t sequences = eval::sequences_in(data.tokens, args->tokens, L);
    if (sequences == 0)
      fail(args->data + "/validation.tokens", "at least " + std::to_string(L + 1) + " tokens (one sequence of --seq-len " + std::to_string(L) + ")",
           std::to_string(data.tokens.size()));

    const Mode mode = args->exact ? Mode::Exact : Mode::Default;
    const GlobalKvFormat kv = args->kv_fp8 ? GlobalKvFormat::Fp8 : GlobalKvFormat::Fp4;
    const std::shared_ptr<const EngramHasher> hasher = engram_hasher(c, &tokenizer);
    const int64_t vocab = sampling_vocab(c, &tokenizer);
    Progress progress(stderr_is_terminal() && !args->as_json);

    // Served loss, one-pass loss and DSpark's acceptance, sequence by sequence.
    double served = 0, one_pass_cont = 0, one_pass_all = 0;
    int64_t served_n = 0, all_n = 0, decoder_prompt = 0;
    eval::Acceptance acceptance;
    const auto t0 = Clock::now();
    for (int64_t k = 0; k < sequences; ++k) {
      progress.update("served loss", k, sequences);
      const std::vector<int> seq = eval::validation_sequence(data.tokens, L, k);
      const eval::ServedNll s = eval::served_nll(*m.executor, hasher, mode, seq, P);
      const std::vector<double> one = eval::one_pass_nll(*m.executor, hasher, seq);
      for (double v : s.nll) served += v;
      served_n += int64_t(s.nll.size());
      decoder_prompt = s.decoder_prompt_tokens;
      for (size_t i = 0; i < one.size(); ++i) {
        one_pass_all += one[i];
        if (int64_t(i) + 1 >= P) one_pass_cont += one[i];  // one[i] scores seq[i + 1]; the continuation is seq[P..L]
      }
      all_n += int64_t(one.size());
      if (args->dspark)
        acceptance.add(eval::dspark_acceptance(*m.executor, hasher, vocab, mode, std::span(seq).first(size_t(P)), args->dspark_tokens,
                                               m.stop_ids));
    }
    const double loss_seconds = seconds_since(t0);
    const double served_loss = mean(served, served_n), cont_loss = mean(one_pass_cont, served_n), all_loss = mean(one_pass_all, all_n);

    json out = {{"model", args->model},
                {"data", args->data},
                {"mode", mode_name(mode)},
                {"global_kv", global_kv_format_name(kv)},
                {"device", m.executor->name()},
                {"window_size", c.window_size},
                {"served_loss",
                 {{"sequences", sequences},
                  {"seq_len", L},
                  {"prompt_tokens", P},
                  {"decoder_prompt_tokens", decoder_prompt},
                  {"scored_tokens", served_n},
                  {"loss", served_loss},
                  {"perplexity", std::exp(served_loss)},
                  {"seconds", loss_seconds}}},
                {"one_pass",
                 {{"loss_continuation", cont_loss},
                  {"perplexity_continuation", std::exp(cont_loss)},
                  {"loss_all", all_loss},
                  {"perplexity_all", std::exp(all_loss)},
                  {"scored_tokens_all", all_n}}}};
    if (args->dspark) {
      const eval::Acceptance& a = acceptance;
      out["dspark"] = {{"prompts", sequences},
                       {"steps", a.steps},
                       {"accepted", a.accepted},
                       {"emitted", a.emitted},
                       {"mean_accepted", mean(double(a.accepted), a.steps)},
                       {"mean_accepted_length", mean(double(a.accepted + a.steps), a.steps)},
                       {"accepted_at", a.accepted_at}};
    }

    // The passkey probe, length by length.
    json passkey = json::array();
    if (!lengths.empty()) {
      const int64_t most = *std::max_element(lengths.begin(), lengths.end());
      const std::vector<int> filler = filler_ids(tokenizer, data.texts, most);
      for (int n : lengths) {
        json replies = json::array();
        int correct = 0;
        for (int t = 0; t < args->passkey_trials; ++t) {
          progress.update("passkey " + std::to_string(n), t, args->passkey_trials);
          const eval::PasskeyTrial trial = eval::passkey_trial(args->seed, n, t);
          const eval::PasskeyPrompt p = eval::passkey_prompt(tokenizer, filler, n, trial.key, trial.depth);
          const eval::PasskeyReply r = eval::passkey_reply(*m.executor, hasher, tokenizer, mode, p.ids, kPasskeyReplyTokens, m.stop_ids);
          const bool ok = eval::passkey_correct(r.text, trial.key);
          correct += ok;
          replies.push_back({{"key", trial.key},
                             {"depth", trial.depth},
                             {"needle_at", p.needle_begin},
                             {"reply", r.text},
                             {"correct", ok}});
        }
        passkey.push_back({{"length", n},
                           {"trials", args->passkey_trials},
                           {"correct", correct},
                           {"accuracy", double(correct) / double(args->passkey_trials)},
                           {"replies", replies}});
      }
      out["passkey"] = passkey;
    }
    progress.clear();

    if (args->as_json) {
      fmt::print("{}\n", out.dump());
      return;
    }
    fmt::print("{} mode, global KV {}, {} executor, window {}\n", mode_name(mode), global_kv_format_name(kv), m.executor->name(),
               c.window_size);
    fmt::print("served loss   {:.4f} (perplexity {:.2f}) over {} tokens: {} sequences of {}, prompt {} ({} through the decoder), "
               "{} decode steps each\n",
               served_loss, std::exp(served_loss), served_n, sequences, L, P, decoder_prompt, L - P);
    fmt::print("one exact pass {:.4f} on the same tokens; {:.4f} (perplexity {:.2f}) over all {} targets\n", cont_loss, all_loss,
               std::exp(all_loss), all_n);
    if (args->dspark)
      fmt::print("dspark        {:.3f} drafts accepted per step, {:.3f} tokens per target pass ({} steps)\n",
                 double(out["dspark"]["mean_accepted"]), double(out["dspark"]["mean_accepted_length"]), acceptance.steps);
    for (const json& p : passkey)
      fmt::print("passkey {:>7}  {}/{} correct\n", int(p["length"]), int(p["correct"]), int(p["trials"]));
  });
}

}  // namespace dsv41::cli
