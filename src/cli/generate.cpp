// dsv41 generate --model DIR (--prompt TEXT | --ids 1,2,3) [--image PATH]... [--exact] [--max-tokens N] [sampling]
//                [--device D] [--speculative auto|dspark|off] [--json]
//
// Streams the completion as it is produced and ends with a one-line summary; --json prints one
// object instead. Each --image takes the place of the next <｜deepseek_image｜> in the prompt text,
// or, when the text has none, the images come first, each followed by a blank line. --speculative dspark decodes with DSpark's drafts verified by the target (greedy:
// the tokens are plain greedy decoding's; sampling: speculative sampling, distributed as plain
// sampling), the drafts listed in --json.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/image_file.h"
#include "cli/model_dir.h"
#include "engine/chat_format.h"
#include "engine/session.h"

namespace dsv41::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<int> parse_ids(const std::string& text) {
  std::vector<int> ids;
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(',', i);
    std::string item = text.substr(i, end == std::string::npos ? std::string::npos : end - i);
    try {
      size_t used = 0;
      ids.push_back(std::stoi(item, &used));
      if (used != item.size()) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail("--ids", "comma-separated token ids like 1,2,3", "\"" + item + "\"");
    }
    if (end == std::string::npos) break;
    i = end + 1;
  }
  if (ids.empty()) fail("--ids", "at least one token id", "none");
  return ids;
}

}  // namespace

void add_generate(CLI::App& app) {
  struct Args {
    std::string model, prompt, ids;
    std::vector<std::string> images;
    bool exact = false, as_json = false;
    Device device = Device::Auto;
    int ranks = 1;
    int max_tokens = 128;
    SamplingParams sampling;
    std::string speculative = "auto";
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("generate", "Complete a prompt, streaming the tokens as they come");
  cmd->add_option("--model", args->model, "Checkpoint directory (config.json, safetensors, tokenizer.json)")->required();
  auto* prompt = cmd->add_option("--prompt", args->prompt, "Prompt text (encoded with the model's tokenizer)");
  auto* ids = cmd->add_option("--ids", args->ids, "Prompt as token ids, e.g. 0,17,42");
  prompt->excludes(ids);
  cmd->add_option("--image", args->images,
                  "Image file (PNG or JPEG; repeatable): each takes the next <｜deepseek_image｜> of --prompt, or comes before the "
                  "text when it has none (a checkpoint with a vision tower)")
      ->excludes(ids);
  cmd->add_flag("--exact", args->exact,
                "Exact mode: every layer on every prompt position, as the official reference computes (default: "
                "decoder bounded replay, the decoder on the prompt's last window only)");
  cmd->add_option("--max-tokens", args->max_tokens, "Most tokens to generate")->check(CLI::Range(1, 1 << 20));
  add_sampling_flags(*cmd, args->sampling);
  add_device_flag(*cmd, args->device, &args->ranks);
  cmd->add_option("--speculative", args->speculative,
                  "dspark: DSpark speculative decoding (CPU or CUDA executor, a checkpoint with DSpark stages); off; "
                  "auto: dspark where the checkpoint has DSpark stages and the model runs on CUDA, else off")
      ->check(CLI::IsMember({"auto", "dspark", "off"}))
      ->capture_default_str();
  cmd->add_flag("--json", args->as_json, "Print one JSON object: prompt_ids, generated_ids, text, timing (and the drafts)");
  cmd->callback([args] {
    if (args->prompt.empty() && args->ids.empty()) fail("generate", "--prompt TEXT or --ids 1,2,3", "neither");
    ModelDir m = load_model_dir(args->model, args->device, std::nullopt, args->ranks);
    const Config& c = m.model->config();
    const std::optional<Tokenizer>& tokenizer = m.tokenizer;
    if (!args->prompt.empty() && !tokenizer) fail(args->model, "a tokenizer.json to encode --prompt", "none (use --ids)");
    std::vector<std::shared_ptr<const ImageInput>> images;
    for (const std::string& path : args->images) images.push_back(load_image_file(path, c));
    std::string text = args->prompt;
    if (!images.empty() && text.find(chat_token::kImage) == std::string::npos) {
      std::string front;
      for (size_t i = 0; i < images.size(); ++i) front += std::string(chat_token::kImage) + "\n\n";
      text = front + text;
    }
    std::vector<PromptImage> placed;
    std::vector<int> prompt_ids = !args->ids.empty() ? parse_ids(args->ids)
                                  : images.empty()   ? tokenizer->encode(text)
                                                     : encode_with_images(*tokenizer, text, true, images, c, placed);
    for (int id : prompt_ids)
      if (id < 0 || id >= c.vocab_size) fail("--ids", "token ids in [0, " + std::to_string(c.vocab_size) + ")", std::to_string(id));
    Session session(*m.executor, m.tokenizer_or_null(), args->exact ? Mode::Exact : Mode::Default);
    // auto: DSpark where the checkpoint has its stages and the model runs on CUDA, when nothing
    // forbids it (logit edits change what a verifier compares); off elsewhere.
    const bool speculative = args->speculative == "dspark" ||
                             (args->speculative == "auto" && c.has_dspark() && m.executor->name() == "cuda" && !args->sampling.edits_logits());
    if (speculative) session.enable_drafting();
    const char* mode = args->exact ? "exact" : "default";
    if (speculative && args->sampling.edits_logits())
      fail("--speculative dspark", "no logit edits (penalties change what a verifier compares)", "penalties set");
    Sampler sampler(args->sampling, c.vocab_size);
    sampler.start_reply(text_tokens(prompt_ids, placed));
    std::optional<StreamDecoder> stream;
    if (tokenizer) stream.emplace(*tokenizer, true);
    auto emit = [&](int id) {
      if (args->as_json) return;
      fmt::print("{}", stream ? stream->push(id) : fmt::format("{} ", id));
      std::fflush(stdout);
    };

    const auto t0 = Clock::now();
    std::vector<float> logits = session.prefill(prompt_ids, placed);
    const Session::Work prefill_work = session.work();
    const double prefill_s = seconds_since(t0);
    std::vector<int> generated;
    json drafts = json::array();
    int decode_steps = 0, decoded = 0;  // target passes after the prefill, and the tokens they chose
    const int64_t vocab = sampling_vocab(c, m.tokenizer_or_null());
    // Speculation's rule: greedy decoding's, or speculative sampling over the sampler's stream.
    std::unique_ptr<Verifier> verifier;
    if (args->sampling.temperature > 0) verifier = std::make_unique<SamplingVerifier>(sampler, c.vocab_size, vocab);
    else verifier = std::make_unique<GreedyVerifier>(c.vocab_size, vocab);
    auto stops = [&](int id) { return std::find(m.stop_ids.begin(), m.stop_ids.end(), id) != m.stop_ids.end(); };
    // Takes `id` as the next generated token unless it stops the reply; whether to go on.
    auto take = [&](int id) {
      if (stops(id)) return false;
      generated.push_back(id);
      emit(id);
      return int(generated.size()) < args->max_tokens;
    };
    const auto t1 = Clock::now();
    int next = sampler.sample(logits.data(), vocab);
    while (take(next)) {
      ++decode_steps;
      if (!speculative) {
        logits = session.decode(next);
        next = sampler.sample(logits.data(), vocab);
        ++decoded;
        continue;
      }
      const Session::Speculation s = session.speculate(next, *verifier);
      drafts.push_back({{"position", s.position}, {"tokens", s.draft}, {"accepted", s.accepted}});
      decoded += int(s.emitted.size());
      bool go_on = true;
      for (size_t i = 0; go_on && i + 1 < s.emitted.size(); ++i) go_on = take(s.emitted[i]);
      if (!go_on) break;
      next = s.emitted.back();
    }
    const double decode_s = seconds_since(t1);
    const double prefill_tps = double(prompt_ids.size()) / prefill_s;
    const double decode_tps = decoded > 0 ? double(decoded) / decode_s : 0.0;

    if (args->as_json) {
      json out = {{"prompt_ids", prompt_ids},
                  {"image_tokens", image_span_tokens(placed)},
                  {"generated_ids", generated},
                  {"text", tokenizer ? tokenizer->decode(generated, true) : ""},
                  {"mode", mode},
                  {"prefill_work", {{"encoder_tokens", prefill_work.encoder_tokens}, {"decoder_tokens", prefill_work.decoder_tokens}}},
                  {"decode_steps", decode_steps},
                  {"timing",
                   {{"prefill_seconds", prefill_s},
                    {"decode_seconds", decode_s},
                    {"prefill_tokens_per_second", prefill_tps},
                    {"decode_tokens_per_second", decode_tps}}}};
      if (speculative) out["drafts"] = drafts;
      fmt::print("{}\n", out.dump());
      return;
    }
    if (stream) fmt::print("{}", stream->flush());
    fmt::print("\n[{} prompt tokens ({} through the decoder), {} generated, {} mode; prefill {:.1f} tok/s, decode {:.1f} tok/s]\n",
               prompt_ids.size(), prefill_work.decoder_tokens, generated.size(), mode, prefill_tps, decode_tps);
  });
}

}  // namespace dsv41::cli
