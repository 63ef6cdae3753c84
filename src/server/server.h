#pragma once
// The OpenAI-compatible HTTP server (DESIGN §5) on cpp-httplib: /v1/chat/completions,
// /v1/completions, /v1/models, /health, /metrics. It listens at once and loads the model in the
// background (/health answers 503 until the model is ready); every request goes through one
// Scheduler (continuous batching) over one KvCache. docs/server.md has the details.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/executors.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "server/access_log.h"
#include "server/image_fetch.h"

namespace dsv41 {

struct ServerOptions {
  std::string model_dir;
  std::string model_name;  // the id in /v1/models and in requests; empty: the directory's name
  std::string host = "127.0.0.1";
  int port = 8080;         // 0: any free port (see Server::port())
  std::string api_key;     // empty: no authentication
  Mode mode = Mode::Default;
  // A chat request's thinking mode when its chat_template_kwargs do not say (V4.1's chat format:
  // on). Off for a model that never learned the reasoning section, as the embedded default.
  bool thinking = true;
  Device device = Device::Auto;  // where the model runs
  int ranks = 1;                 // the model cut over that many ranks (docs/parallel.md)
  std::optional<uint64_t> random_weights;  // a seed: random weights on the device (make_executor)
  KvCacheOptions cache;    // fingerprint and mode are filled in from the checkpoint
  SchedulerOptions scheduler;  // its kv_budget_bytes comes from kv_budget_gb below
  // `--speculative auto`: scheduler.speculative decided once the model is loaded — DSpark where the
  // checkpoint has its stages and the model runs on CUDA (a speculating step there costs about a
  // plain one when nothing is drafted: docs/benchmarks.md); on the CPU, off.
  bool speculative_auto = false;
  double kv_budget_gb = -1;  // the sequences' KV budget; -1: the executor's default; 0: none
  // A few requests served to itself before it says ready (engine/warm_up.h). Auto: on CUDA, whose
  // kernels load at their first launch; not on the CPU, where it would only cost time.
  enum class WarmUp { Auto, On, Off } warm_up = WarmUp::Auto;
  // A stream silent this long (a long prefill, a slow step) gets a ": keep-alive" comment, a
  // non-streamed reply a space: a byte that costs the client nothing, to learn if it is still there.
  int heartbeat_ms = 1000;
  ImageFetchOptions image_fetch;  // whether, and how, image_url parts' http(s) URLs are fetched
  LogFormat log_format = LogFormat::Text;  // the access log's (server/access_log.h)
  std::function<void(const std::string& line)> access_log;  // where its lines go; empty: stderr
  std::function<void(int port)> on_listening;  // called once bound, before the model loads
  std::function<void()> before_load;           // called on the loading thread, before it loads
  // Called on the loading thread at each step of the load (`step` the one starting, `done` of
  // `total` done), and with done == total once the model is ready: dsv41 serve's progress line.
  std::function<void(const std::string& step, int done, int total)> on_load_step;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  // Listens, loads the model, serves until stop(). Throws dsv41::Error if it cannot listen or
  // the model does not load.
  void run();
  void stop();
  // The port it listens on, once it does (0 before).
  int port() const { return port_.load(); }

 private:
  struct State;
  std::unique_ptr<State> state_;
  std::atomic<int> port_{0};
};

}  // namespace dsv41
