// dsv41 chat --model DIR [--system TEXT] [--thinking] [--exact] [--max-tokens N] [sampling] [cache flags]
//            [--device D] [--json]
//
// One conversation over standard input: every non-empty line is a user turn (on a terminal with
// line editing and history, through libedit); a line `/image PATH` adds an image (PNG or JPEG) to
// the next user turn, before its text, as an image part would. The whole conversation is rendered in
// DeepSeek-V4.1's chat format each turn and handed to the session, which reuses what it can — its
// own running sequence, the SWA pool, the host cache, the disk — so each turn shows how many prompt
// tokens were cached, replayed and computed. Reasoning (--thinking) is shown dimmed apart from the
// answer; Ctrl-C stops a reply, not the conversation; a turn the context cannot hold is refused
// and the conversation goes on.
#include <fmt/core.h>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#ifdef DSV41_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "base/error.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/image_file.h"
#include "cli/model_dir.h"
#include "engine/chat_format.h"
#include "engine/session.h"

namespace dsv41::cli {

namespace {

using Clock = std::chrono::steady_clock;

// "412 prompt tokens: 380 cached (device 380), 0 replayed, 32 computed"
ChatMessage message(ChatRole role, std::string content) {
  ChatMessage m;
  m.role = role;
  m.content = std::move(content);
  return m;
}

std::string describe(const PrefixUse& u) {
  std::string where;
  auto add = [&](const char* name, int64_t n) {
    if (n > 0) where += fmt::format("{}{} {}", where.empty() ? "" : ", ", name, n);
  };
  add("device", u.device_tokens);
  add("swa pool", u.swa_tokens);
  add("global blocks", u.global_tokens);
  std::string blocks = u.host_blocks + u.disk_blocks > 0
                           ? fmt::format("; blocks from host {}, disk {}", u.host_blocks, u.disk_blocks)
                           : "";
  return fmt::format("{} prompt tokens: {} cached{}, {} replayed, {} computed{}", u.prompt_tokens, u.cached(),
                     where.empty() ? "" : " (" + where + ")", u.replayed, u.computed(), blocks);
}

// ANSI: reasoning dimmed, then back to plain for the answer.
constexpr const char* kDim = "\x1b[2m";
constexpr const char* kPlain = "\x1b[0m";

// Lines of standard input: through libedit (line editing, history) on a terminal, else as they come.
class LineReader {
 public:
  explicit LineReader(bool interactive) : interactive_(interactive) {}
  bool read(std::string& line) {
#ifdef DSV41_HAVE_LIBEDIT
    if (interactive_) {
      char* got = readline("> ");
      if (!got) return false;
      line = got;
      std::free(got);
      if (!line.empty()) add_history(line.c_str());
      return true;
    }
#endif
    if (interactive_) fmt::print("> "), std::fflush(stdout);
    return bool(std::getline(std::cin, line));
  }

 private:
  bool interactive_;
};

// While alive, SIGINT sets a flag instead of ending the program: a reply in progress stops at the
// next token and the conversation goes on. (At the prompt Ctrl-C ends the program as usual.)
class CancelOnInterrupt {
 public:
  CancelOnInterrupt() {
    fired_ = 0;
    struct sigaction on {};
    on.sa_handler = [](int) { fired_ = 1; };
    sigemptyset(&on.sa_mask);
    sigaction(SIGINT, &on, &before_);
  }
  ~CancelOnInterrupt() { sigaction(SIGINT, &before_, nullptr); }
  CancelOnInterrupt(const CancelOnInterrupt&) = delete;
  CancelOnInterrupt& operator=(const CancelOnInterrupt&) = delete;
  bool fired() const { return fired_ != 0; }

 private:
  static inline volatile std::sig_atomic_t fired_ = 0;
  struct sigaction before_ {};
};

}  // namespace

void add_chat(CLI::App& app) {
  struct Args {
    std::string model, system;
    bool thinking = false, exact = false, as_json = false;
    Device device = Device::Auto;
    int ranks = 1;
    int max_tokens = 256;
    bool ignore_eos = false;
    SamplingParams sampling;
    CacheFlags cache;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("chat", "Talk to the model: each line of standard input is a user turn");
  cmd->add_option("--model", args->model, "Checkpoint directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--system", args->system, "System prompt");
  cmd->add_flag("--thinking", args->thinking, "Thinking mode: the model reasons before it answers");
  cmd->add_flag("--exact", args->exact, "Exact mode: every layer on every position, no bounded replay");
  cmd->add_option("--max-tokens", args->max_tokens, "Most tokens per reply")->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--ignore-eos", args->ignore_eos, "The end-of-sequence token does not end a reply (replies of --max-tokens)");
  add_sampling_flags(*cmd, args->sampling);
  add_cache_flags(*cmd, args->cache);
  add_device_flag(*cmd, args->device, &args->ranks);
  cmd->add_flag("--json", args->as_json, "Print one JSON object per turn instead of the reply text");
  cmd->callback([args] {
    ModelDir m = load_model_dir(args->model, args->device, std::nullopt, args->ranks);
    if (!m.tokenizer) fail(args->model, "a tokenizer.json (chat renders text)", "none");
    const Tokenizer& tokenizer = *m.tokenizer;
    const Config& c = m.model->config();
    const Mode mode = args->exact ? Mode::Exact : Mode::Default;
    KvCache cache(c, cache_options(args->cache, args->model, mode));
    Session session(*m.executor, &tokenizer, mode);
    Sampler sampler(args->sampling, c.vocab_size);
    std::vector<int> stop = args->ignore_eos ? std::vector<int>{} : m.stop_ids;
    if (std::optional<int> eos = tokenizer.token_to_id(chat_token::kEos); eos && !args->ignore_eos) stop.push_back(*eos);

    std::vector<ChatMessage> messages;
    if (!args->system.empty()) messages.push_back(message(ChatRole::system, args->system));
    std::vector<std::shared_ptr<const ImageInput>> images;  // the conversation's, in order
    size_t pending_images = 0;                               // of them, for the next user turn
    ChatOptions options;
    options.thinking = args->thinking;
    const bool interactive = isatty(STDIN_FILENO) && !args->as_json;
    const bool styled = !args->as_json && isatty(STDOUT_FILENO);  // reasoning dimmed apart from the answer
    const std::optional<int> think_end = tokenizer.token_to_id(chat_token::kThinkEnd);
    LineReader input(interactive);
    std::string line;
    for (int turn = 1;; ++turn) {
      if (!input.read(line)) break;
      if (line.empty()) {
        --turn;
        continue;
      }
      if (line.starts_with("/image ")) {
        --turn;
        const std::string path = line.substr(7);
        try {
          images.push_back(load_image_file(path, c));
          pending_images += 1;
          const ImagePlan& plan = images.back()->plan;
          if (!args->as_json)
            fmt::print(stderr, "[image {}: {} x {}, {} tokens, for the next turn]\n", path, images.back()->width,
                       images.back()->height, plan.span_tokens());
        } catch (const Error& e) {  // a bad image is refused; the conversation goes on
          if (args->as_json) fmt::print("{}\n", nlohmann::json{{"turn", turn + 1}, {"error", e.what()}}.dump());
          else fmt::print(stderr, "[{}]\n", e.what());
          std::fflush(stdout);
        }
        continue;
      }
      ChatMessage user = message(ChatRole::user, line);
      // The turn's images first, joined to its text as content parts are.
      std::string parts;
      for (size_t i = images.size() - pending_images; i < images.size(); ++i) {
        parts += std::string(chat_token::kImage) + "\n\n";
        user.image_urls.push_back("image " + std::to_string(i));
      }
      user.content = parts + user.content;
      messages.push_back(user);
      std::vector<PromptImage> placed;
      std::vector<int> prompt;
      try {
        prompt = encode_with_images(tokenizer, render_chat(messages, options), /*add_special_tokens=*/false, images, c, placed);
      } catch (const Error& e) {  // text that spells the image placeholder: refused, the conversation goes on
        messages.pop_back();
        fmt::print(stderr, "[{}]\n", e.what());
        continue;
      }
      // A turn that leaves no room for a reply is refused; the conversation goes on without it.
      const int64_t room = c.max_seq_len - int64_t(prompt.size());
      if (room < 1) {
        messages.pop_back();
        images.resize(images.size() - pending_images);
        pending_images = 0;
        const std::string why = fmt::format("the conversation would be {} tokens, the context holds {}: turn refused",
                                            prompt.size(), c.max_seq_len);
        if (args->as_json) fmt::print("{}\n", nlohmann::json{{"turn", turn}, {"error", why}}.dump());
        else fmt::print(stderr, "[{}]\n", why);
        std::fflush(stdout);
        continue;
      }
      const int64_t max_tokens = std::min<int64_t>(args->max_tokens, room);
      pending_images = 0;

      const auto t0 = Clock::now();
      sampler.start_reply(text_tokens(prompt, placed));
      PrefixUse use;
      std::vector<float> logits = session.prefill_prompt(prompt, &cache, &use, placed);
      const double ttft = std::chrono::duration<double>(Clock::now() - t0).count();
      StreamDecoder stream(tokenizer, /*skip_special_tokens=*/true);
      std::vector<int> reply;  // the stop token, if one came, is the last and not generated text
      int64_t generated = 0;
      bool reasoning = options.thinking;  // the rendered prompt opens the reply in reasoning
      if (reasoning && styled) fmt::print("{}", kDim);
      const CancelOnInterrupt interrupt;  // Ctrl-C ends this reply, not the program
      while (generated < max_tokens && !interrupt.fired()) {
        const int next = sampler.sample(logits.data(), sampling_vocab(c, m.tokenizer_or_null()));
        reply.push_back(next);
        if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
        generated += 1;
        if (!args->as_json) {
          fmt::print("{}", stream.push(next));
          if (reasoning && think_end && next == *think_end) {
            reasoning = false;
            fmt::print("{}\n", styled ? kPlain : "");
          }
          std::fflush(stdout);
        }
        logits = session.decode(next);
      }
      if (reasoning && styled) fmt::print("{}", kPlain);
      const bool cancelled = interrupt.fired();
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      // The end of the output is the SWA pool's second entry of the turn (DESIGN §4).
      session.save(cache);

      const ParsedReply parsed = parse_reply(tokenizer.decode(reply), options.thinking);
      ChatMessage answer = message(ChatRole::assistant, parsed.content);
      if (options.thinking) answer.reasoning_content = parsed.reasoning;
      messages.push_back(answer);
      if (args->as_json) {
        nlohmann::json j = {{"turn", turn},
                            {"reply", parsed.content},
                            {"prompt_tokens", use.prompt_tokens},
                            {"image_tokens", image_span_tokens(placed)},
                            {"cached_tokens", use.cached()},
                            {"device_tokens", use.device_tokens},
                            {"swa_tokens", use.swa_tokens},
                            {"global_tokens", use.global_tokens},
                            {"host_blocks", use.host_blocks},
                            {"disk_blocks", use.disk_blocks},
                            {"replayed_tokens", use.replayed},
                            {"computed_tokens", use.computed()},
                            {"generated_tokens", generated},
                            {"cancelled", cancelled},
                            {"ttft_ms", ttft * 1e3},
                            {"seconds", seconds}};
        fmt::print("{}\n", j.dump());
      } else {
        fmt::print("{}\n[turn {}: {}; {} generated{}; first token {:.2f} s]\n", stream.flush(), turn, describe(use),
                   generated, cancelled ? ", cancelled" : "", ttft);
      }
      std::fflush(stdout);
    }
  });
}

}  // namespace dsv41::cli
