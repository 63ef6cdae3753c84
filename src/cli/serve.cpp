// dsv41 serve --model DIR [--host 127.0.0.1] [--port 8080] [--api-key K | --api-key-file F] [--exact]
//             [--device auto|cpu|cuda] [--random-weights SEED] [--speculative auto|dspark|off] [--warm-up auto|on|off]
//             [--fetch-image-urls [--image-fetch-max-mb M] [--image-fetch-timeout S]] [scheduler and cache flags]
//
// The OpenAI-compatible server (server/server.h). Stops on SIGINT or SIGTERM.
#include <fmt/core.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "cli/commands.h"
#include "base/error.h"
#include "cli/flags.h"
#include "cli/progress.h"
#include "server/server.h"

namespace dsv41::cli {

void add_serve(CLI::App& app) {
  struct Args {
    ServerOptions server;
    CacheFlags cache;
    bool exact = false;
    std::string api_key_file;
    std::string speculative = "auto";
    double fetch_max_mb = 0;
  };
  auto args = std::make_shared<Args>();
  ServerOptions& o = args->server;
  CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  cmd->add_option("--model", o.model_dir, "Checkpoint directory (config.json, safetensors, tokenizer.json)")->required();
  cmd->add_option("--model-name", o.model_name, "The model's id in the API (default: the directory's name)");
  cmd->add_option("--host", o.host, "Address to listen on");
  cmd->add_option("--port", o.port, "Port to listen on (0: any free port)")->check(CLI::Range(0, 65535));
  // A key on the command line is visible to every user in `ps`: the file or the environment is not.
  CLI::Option* key = cmd->add_option("--api-key", o.api_key, "Require 'Authorization: Bearer KEY' on /v1 routes")
                         ->envname("DSV41_API_KEY");
  cmd->add_option("--api-key-file", args->api_key_file, "Read the API key from the first line of this file")->excludes(key);
  cmd->add_flag("--exact", args->exact, "Exact mode: every layer on every position, no bounded replay");
  cmd->add_option("--thinking", o.thinking,
                  "Chat requests' thinking mode when chat_template_kwargs does not set it: on (V4.1's chat format) or off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, bool>{{"on", true}, {"off", false}}, CLI::ignore_case))
      ->default_str("on");
  cmd->add_option("--log-format", o.log_format, "The access log on stderr, a line per request: text, json or off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, LogFormat>{{"text", LogFormat::Text}, {"json", LogFormat::Json},
                                                                           {"off", LogFormat::Off}},
                                          CLI::ignore_case))
      ->default_str("text");
  cmd->add_option("--max-running", o.scheduler.max_running, "Sequences in one batch")->check(CLI::Range(1, 4096));
  cmd->add_option("--max-queued", o.scheduler.max_queued, "Requests waiting to join; more get 503")->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--step-tokens", o.scheduler.step_tokens, "Prompt tokens per step (chunked prefill budget; default: CUDA 8192, CPU 256)")
      ->check(CLI::Range(1, 1 << 24))
      ->default_str("");
  cmd->add_option("--kv-budget-gb", o.kv_budget_gb,
                  "KV the sequences may hold, GB (default: CUDA half the device memory free after the weights, CPU none; 0: none)")
      ->check(CLI::NonNegativeNumber)
      ->default_str("");
  cmd->add_option("--warm-up", o.warm_up,
                  "Serve a few requests to itself before it says ready, so that the first users' requests do not "
                  "load kernels: auto (on with CUDA), on or off")
      ->transform(CLI::CheckedTransformer(std::map<std::string, ServerOptions::WarmUp>{{"auto", ServerOptions::WarmUp::Auto},
                                                                                       {"on", ServerOptions::WarmUp::On},
                                                                                       {"off", ServerOptions::WarmUp::Off}},
                                          CLI::ignore_case))
      ->default_str("auto");
  add_cache_flags(*cmd, args->cache);
  add_device_flag(*cmd, o.device, &o.ranks);
  cmd->add_option("--speculative", args->speculative,
                  "dspark: DSpark speculative decoding for requests without logprobs (a checkpoint with DSpark stages); off; "
                  "auto: dspark where the checkpoint has DSpark stages and the model runs on CUDA, else off")
      ->check(CLI::IsMember({"auto", "dspark", "off"}))
      ->capture_default_str();
  cmd->add_flag("--fetch-image-urls", o.image_fetch.enabled,
                "Fetch image_url parts' http(s) URLs (off: data: URLs only; on, clients can make this server request any "
                "address it reaches)");
  args->fetch_max_mb = double(o.image_fetch.max_bytes) / (1 << 20);
  cmd->add_option("--image-fetch-max-mb", args->fetch_max_mb, "The largest image a fetch reads, MiB")
      ->check(CLI::Range(0.001, 1024.0))
      ->capture_default_str();
  cmd->add_option("--image-fetch-timeout", o.image_fetch.timeout_s, "Seconds a fetch may wait to connect and between reads")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  cmd->add_option("--random-weights", o.random_weights,
                  "Random weights made on the device from this seed instead of the checkpoint's (CUDA; benchmarks over "
                  "`init-random --layout-only`)");
  cmd->callback([args] {
    ServerOptions options = args->server;
    check_device(options.device);
    if (!args->api_key_file.empty()) {
      std::ifstream in(args->api_key_file);
      if (!in) fail(args->api_key_file, "a readable file holding the API key", "one we cannot open");
      std::getline(in, options.api_key);
      if (!options.api_key.empty() && options.api_key.back() == '\r') options.api_key.pop_back();
      if (options.api_key.empty()) fail(args->api_key_file, "an API key on its first line", "an empty line");
    }
    options.mode = args->exact ? Mode::Exact : Mode::Default;
    options.image_fetch.max_bytes = int64_t(args->fetch_max_mb * (1 << 20));
    options.scheduler.speculative = args->speculative == "dspark";
    options.speculative_auto = args->speculative == "auto";
    if (options.model_name.empty()) options.model_name = std::filesystem::path(options.model_dir).filename().string();
    options.cache = cache_options(args->cache, options.model_dir, options.mode);
    options.on_listening = [&options](int port) {
      const std::string base = fmt::format("http://{}:{}", options.host, port);
      fmt::print("dsv41: listening on {} (loading {}; /health says 503 until it is ready)\n", base, options.model_dir);
      fmt::print("  curl {}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
                 "       -d '{{\"model\": \"{}\", \"max_tokens\": 64, \"messages\": [{{\"role\": \"user\", \"content\": \"Hello\"}}]}}'\n",
                 base, options.model_name);
      fmt::print("  OpenAI clients: base_url {}/v1\n", base);
      std::fflush(stdout);
    };
    // The load's progress line on a terminal, the access log's lines (a probe's while it loads)
    // above it.
    Progress progress(stderr_is_terminal(), /*elapsed=*/true);
    options.on_load_step = [&progress, &options](const std::string& step, int done, int total) {
      if (done == total) progress.clear();
      else progress.update("loading " + options.model_dir + ": " + step, done, total);
    };
    if (stderr_is_terminal()) options.access_log = [&progress](const std::string& line) { progress.line(line); };
    // SIGINT / SIGTERM stop the server from a thread of its own (stop() is not signal-safe).
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    Server server(options);
    std::thread waiter([&] {
      int sig = 0;
      sigwait(&signals, &sig);
      server.stop();
    });
    try {
      server.run();
    } catch (...) {
      pthread_kill(waiter.native_handle(), SIGTERM);
      waiter.join();
      throw;
    }
    pthread_kill(waiter.native_handle(), SIGTERM);
    waiter.join();
    fmt::print("dsv41: stopped\n");
  });
}

}  // namespace dsv41::cli
