#include "server/server.h"

#include <httplib.h>
#include <malloc.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "base/error.h"
#include "engine/chat_format.h"
#include "engine/grammar/structured.h"
#include "engine/warm_up.h"
#include "kv/checkpoint_identity.h"
#include "server/metrics.h"
#include "server/image_url.h"
#include "server/openai_api.h"
#include "server/stop_strings.h"
#include "server/web/chat_page.h"

namespace dsv41 {

namespace {

using Steady = std::chrono::steady_clock;

// The access log's record of the request this thread serves: cpp-httplib runs a request's handler,
// its streamed body and its logger on one thread of its pool, so a thread-local record is the
// request's own from the routing to the logger.
struct AccessRecord {
  bool started = false;
  Steady::time_point arrived;
  int64_t prompt_tokens = -1, cached_tokens = 0, output_tokens = 0;
  double ttft_s = -1;
};
thread_local AccessRecord access;
using json = nlohmann::json;

// The largest request body read (a chat of 16K-token turns is a few MB).
constexpr size_t kMaxBodyBytes = size_t(64) << 20;
constexpr size_t kSlowConnections = 256;

double seconds_since(Steady::time_point t) { return std::chrono::duration<double>(Steady::now() - t).count(); }

// One token's text: raw bytes, perhaps part of a UTF-8 character (logprobs carry it so).
std::string token_text(const Tokenizer& tokenizer, int id) { return tokenizer.decode(std::span<const int>(&id, 1)); }

// Turns one request's token events into what the response carries: text (completions) or
// reasoning / content / tool calls (chat), cut at the first stop string, and the logprobs.
class ReplyStream {
 public:
  ReplyStream(const Tokenizer& tokenizer, std::vector<std::string> stops, bool chat, bool thinking, int top_logprobs)
      : tokenizer_(tokenizer), decoder_(tokenizer, false), stops_(std::move(stops)), top_logprobs_(top_logprobs) {
    if (chat) parser_.emplace(thinking);
  }

  struct Delta {
    std::string text, reasoning;  // text: the completion, or the chat content
    std::vector<ToolCall> tool_calls;
    std::vector<TokenLogprob> logprobs;
    bool empty() const { return text.empty() && reasoning.empty() && tool_calls.empty() && logprobs.empty(); }
  };

  Delta push(const TokenChoice& e) {
    Delta d;
    if (top_logprobs_ >= 0) d.logprobs.push_back(logprob(tokenizer_, e));
    take(stops_.push(decoder_.push(e.token)), d);
    return d;
  }
  Delta finish() {
    Delta d;
    if (!stops_.stopped()) take(stops_.push(decoder_.flush()), d);
    take(stops_.flush(), d);
    if (parser_) add(parser_->finish(), d);
    return d;
  }
  bool stopped() const { return stops_.stopped(); }
  bool made_tool_calls() const { return tool_calls_ > 0; }
  // A scored token as the response lists it: its text and logprob, and the alternatives'.
  static TokenLogprob logprob(const Tokenizer& tokenizer, const TokenChoice& e) {
    TokenLogprob lp{token_text(tokenizer, e.token), e.logprob, {}};
    for (const auto& [id, logprob] : e.top) lp.top.push_back({token_text(tokenizer, id), logprob});
    return lp;
  }

 private:
  void take(const std::string& text, Delta& d) {
    if (text.empty()) return;
    if (parser_)
      add(parser_->push(text), d);
    else
      d.text += text;
  }
  void add(const ReplyDelta& r, Delta& d) {
    d.reasoning += r.reasoning;
    d.text += r.content;
    for (const ParsedToolCall& call : r.tool_calls)
      d.tool_calls.push_back({new_response_id("call").substr(0, 29), call.name, call.arguments}), ++tool_calls_;
  }

  const Tokenizer& tokenizer_;
  StreamDecoder decoder_;
  StopStrings stops_;
  std::optional<ReplyParser> parser_;
  int top_logprobs_;
  int tool_calls_ = 0;
};

FinishReason finish_reason(FinishKind kind, const ReplyStream& reply) {
  if (reply.made_tool_calls()) return FinishReason::ToolCalls;
  return kind == FinishKind::Length && !reply.stopped() ? FinishReason::Length : FinishReason::Stop;
}

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(json_text(e.body()), "application/json");
}

// The connections the kernel holds for the listener before it accepts them. cpp-httplib listens
// with a backlog of 5 (compiled into Debian's library): a burst of clients overflows it, and the
// connections the kernel then completes with SYN cookies but cannot queue are dropped — a client
// at concurrency 64 saw its request end in a read error, never reaching a handler.
constexpr int kListenBacklog = 4096;

// cpp-httplib's server with its listening socket in reach (a protected member there), so that
// run() can listen on it again with kListenBacklog (Linux takes a new backlog on a socket that
// listens already).
class HttpServer : public httplib::Server {
 public:
  socket_t listening_socket() const { return svr_sock_; }
};

// The socket of the connection a request came on. cpp-httplib 0.11 gives a handler no handle on
// it, so it is found among the process's sockets by its two addresses (the request's remote and
// local ones). A worker thread serves one connection at a time, its requests one after another:
// the last socket found is kept per thread and checked again first. -1 if none matches.
int connection_socket(const httplib::Request& req) {
  thread_local int last = -1;
  const auto matches = [&](int fd) {
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof(peer), local_len = sizeof(local);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) != 0)
      return false;
    const auto port = [](const sockaddr_storage& a) {
      if (a.ss_family == AF_INET) return int(ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port));
      if (a.ss_family == AF_INET6) return int(ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port));
      return -1;
    };
    const auto host = [](const sockaddr_storage& a) {
      char text[INET6_ADDRSTRLEN] = "";
      if (a.ss_family == AF_INET) inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, text, sizeof(text));
      if (a.ss_family == AF_INET6) inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, text, sizeof(text));
      return std::string(text);
    };
    return port(peer) == req.remote_port && port(local) == req.local_port && host(peer) == req.remote_addr;
  };
  if (last >= 0 && matches(last)) return last;
  last = -1;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    const std::string name = entry.path().filename().string();
    if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc{}) continue;
    if (matches(fd)) return last = fd;
  }
  return -1;
}

// Whether the client of connection `fd` has gone: its end closed (a read would see end of file)
// or reset. Bytes it sent ahead (a pipelined request) are not a departure; nothing is consumed.
bool client_gone(int fd) {
  if (fd < 0) return false;
  char byte;
  const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace

struct Server::State {
  ServerOptions options;
  HttpServer http;
  std::atomic<bool> ready{false};
  std::string load_error;

  std::unique_ptr<Model> model;
  std::unique_ptr<Executor> executor;
  std::optional<Tokenizer> tokenizer;
  std::vector<int> stop_ids;
  std::shared_ptr<StoreLock> store_lock;  // taken before listening (run())
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<grammar::GrammarCache> grammars;  // structured output: compiled grammars by schema
  ApiConfig api;
  int64_t created = 0;
  int64_t kv_budget = 0;  // the scheduler's
  double warm_up_seconds = 0;  // engine/warm_up.h; 0 when it did not run

  MetricsRegistry metrics;
  std::mutex scrape;  // a scrape raises counters to the engine's totals: one at a time
  Histogram* ttft = nullptr;
  Counter* parse = nullptr;
  Histogram* duration = nullptr;

  void load();
  void routes();
  // Every route with its one method, registered through route(): the error handler answers a
  // request under another method from this table.
  std::map<std::string, std::string> methods;
  void route(const std::string& method, const std::string& path, httplib::Server::Handler handler) {
    methods[path] = method;
    if (method == "GET")
      http.Get(path, std::move(handler));
    else
      http.Post(path, std::move(handler));
  }
  bool authorized(const httplib::Request& req, httplib::Response& res);
  void generate(const httplib::Request& req, httplib::Response& res, bool chat);
  // A chat request's prompt as /v1/chat/completions runs it (rendered, then encoded, each image
  // part decoded and placed at its span in `images`); `thinking` receives whether the reply opens
  // in reasoning.
  std::vector<int> chat_prompt(const ChatRequest& r, bool& thinking, std::vector<PromptImage>& images) const;
  std::string render_metrics();
  Counter& http_responses(int status) {
    return metrics.counter("dsv41_http_responses_total", "HTTP responses by status", {{"status", std::to_string(status)}});
  }
};

std::vector<int> Server::State::chat_prompt(const ChatRequest& r, bool& thinking, std::vector<PromptImage>& images) const {
  ChatOptions chat_options;
  chat_options.thinking = options.thinking;
  try {
    const std::vector<ChatMessage> messages = chat_messages_from_json(r.messages);
    // The images first: a bad one is the request's first error, before anything is rendered.
    const std::vector<std::string> urls = chat_image_urls(messages);
    if (!urls.empty() && !model->has_vision())
      throw ApiError(400, "messages: expected no image parts for a model without a vision tower (" + options.model_name + "), found " +
                              std::to_string(urls.size()), "messages", "invalid_value");
    std::vector<std::shared_ptr<const ImageInput>> inputs;
    for (size_t i = 0; i < urls.size(); ++i) inputs.push_back(load_image_url(urls[i], i, model->config(), options.image_fetch));
    chat_options.tools = chat_tools_from_json(r.tools);
    if (!r.reasoning_effort.is_null()) chat_options.reasoning_effort = reasoning_effort_from_json(r.reasoning_effort);
    if (r.chat_template_kwargs.is_object() && r.chat_template_kwargs.contains("thinking")) {
      const auto& t = r.chat_template_kwargs["thinking"];
      if (!t.is_boolean())
        throw ApiError(400, "chat_template_kwargs.thinking: expected a boolean, found " + std::string(t.type_name()),
                       "chat_template_kwargs", "invalid_type");
      chat_options.thinking = t.get<bool>();
    }
    thinking = chat_options.thinking;
    return encode_with_images(*tokenizer, render_chat(messages, chat_options), /*add_special_tokens=*/false, inputs,
                              model->config(), images);
  } catch (const Error& e) {
    throw ApiError(400, e.what(), "messages", "invalid_value");
  }
}

void Server::State::load() {
  const std::string& dir = options.model_dir;
  constexpr int kSteps = 5;
  const auto step = [&](const char* what, int done) {
    if (options.on_load_step) options.on_load_step(what, done, kSteps);
  };
  step("the checkpoint", 0);
  model = Model::load(dir);
  step("the weights to the executor", 1);
  executor = make_executor(*model, options.device, options.random_weights, options.ranks);
  step("the tokenizer", 2);
  if (!std::filesystem::exists(dir + "/tokenizer.json")) fail(dir, "a tokenizer.json (the server speaks text)", "none");
  tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
  if (std::optional<int> eos = config_eos_id(dir, *tokenizer)) stop_ids.push_back(*eos);
  if (std::optional<int> eos = tokenizer->token_to_id(chat_token::kEos)) stop_ids.push_back(*eos);
  step("the KV tiers", 3);  // the store's index is rebuilt by scanning its files
  KvCacheOptions cache_options = options.cache;
  cache_options.fingerprint = "checkpoint " + checkpoint_identity(dir);
  cache_options.mode = mode_name(options.mode);
  cache_options.store_lock = store_lock;
  cache = std::make_unique<KvCache>(model->config(), cache_options);
  if (const KvCacheStats s = cache->stats(); s.store && (s.store->dropped_files > 0 || s.store->removed_temp_files > 0))
    std::fprintf(stderr, "dsv41: store %s: dropped %llu damaged or foreign block files, removed %llu unfinished writes\n",
                 cache_options.store_dir.c_str(), (unsigned long long)s.store->dropped_files,
                 (unsigned long long)s.store->removed_temp_files);
  SchedulerOptions scheduler_options = options.scheduler;
  if (options.speculative_auto) scheduler_options.speculative = model->config().has_dspark() && executor->name() == "cuda";
  scheduler_options.idle_ttl_ms = cache_options.swa.ttl_ms;
  scheduler_options.kv_budget_bytes = options.kv_budget_gb < 0 ? executor->default_kv_budget() : int64_t(options.kv_budget_gb * 1e9);
  kv_budget = scheduler_options.kv_budget_bytes;
  step("the warm-up", 4);
  const bool warm = options.warm_up == ServerOptions::WarmUp::On ||
                    (options.warm_up == ServerOptions::WarmUp::Auto && executor->name() == "cuda");
  if (warm) {
    const WarmUpResult w = warm_up(*executor, &*tokenizer, options.mode, scheduler_options);
    warm_up_seconds = w.seconds;
    std::fprintf(stderr, "dsv41: warmed up in %.2f s (%lld requests, %lld prompt tokens, %lld generated)\n", w.seconds,
                 (long long)w.requests, (long long)w.prompt_tokens, (long long)w.output_tokens);
  }
  scheduler = std::make_unique<Scheduler>(*executor, &*tokenizer, options.mode, cache.get(), scheduler_options);
  step("ready", kSteps);
  std::fprintf(stderr, "dsv41: the model runs on %s\n", executor->name().c_str());
  api.models = {options.model_name};
  api.vocab_size = sampling_vocab(model->config(), &*tokenizer);
  grammars = std::make_unique<grammar::GrammarCache>(grammar::Vocabulary::from_tokenizer(*tokenizer, api.vocab_size, stop_ids));
  api.structured_output = true;
  api.max_choices = scheduler_options.max_running;
  ready = true;
}

bool Server::State::authorized(const httplib::Request& req, httplib::Response& res) {
  if (options.api_key.empty() || req.get_header_value("Authorization") == "Bearer " + options.api_key) return true;
  send_error(res, ApiError(401, "Authorization: expected \"Bearer <the server's API key>\", found " +
                                    std::string(req.has_header("Authorization") ? "another key" : "none"),
                           "", "invalid_api_key", "authentication_error"));
  return false;
}

void Server::State::generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  const auto arrived = Steady::now();
  if (!ready) return send_error(res, ApiError(503, "the model is still loading; retry shortly", "", "", "server_error"));

  // Parse and tokenize: every failure here is the client's, answered before anything runs.
  GenerationParams gen;
  GenerationRequest request;
  bool thinking = false;
  std::optional<std::string> echo;  // completions with "echo": the prompt's text, which each choice's text starts with
  int prompt_logprobs = -1;         // and with logprobs too, the prompt's tokens' (GenerationRequest::prompt_logprobs)
  try {
    if (chat) {
      ChatRequest r = parse_chat_request(req.body, api);
      gen = r.gen;
      request.prompt = chat_prompt(r, thinking, request.images);
      // response_format and required tool calls: the reply's grammar, from the end of its reasoning.
      request.grammar = output_grammar(r, *grammars);
      if (thinking && request.grammar) request.grammar_after = std::string(chat_token::kThinkEnd);
    } else {
      CompletionRequest r = parse_completion_request(req.body, api);
      gen = r.gen;
      if (const auto* text = std::get_if<std::string>(&r.prompt))
        request.prompt = tokenizer->encode(*text);
      else
        request.prompt.assign(std::get<std::vector<int32_t>>(r.prompt).begin(), std::get<std::vector<int32_t>>(r.prompt).end());
      if (r.echo) {
        const auto* text = std::get_if<std::string>(&r.prompt);
        echo = text ? *text : tokenizer->decode(request.prompt, false);
        if (r.gen.logprobs.enabled) prompt_logprobs = r.gen.logprobs.top;
      }
      if (request.prompt.empty()) throw ApiError(400, "prompt: expected text that encodes to at least one token, found none", "prompt", "invalid_value");
    }
    check_context_length(int64_t(request.prompt.size()), gen.sampling.max_tokens, model->config().max_seq_len);
  } catch (const ApiError& e) {
    return send_error(res, e);
  }
  const RequestSampling& s = gen.sampling;
  request.sampling = SamplingParams{s.temperature,          s.top_k,          s.top_p, s.min_p, uint64_t(s.seed.value_or(0)),
                                    s.logit_bias,           s.repetition_penalty, s.presence_penalty, s.frequency_penalty};
  request.max_tokens = s.max_tokens.value_or(int32_t(model->config().max_seq_len - int64_t(request.prompt.size())));
  if (!s.ignore_eos) request.stop_ids = stop_ids;
  request.seeded = s.seed.has_value();
  request.top_logprobs = gen.logprobs.enabled ? gen.logprobs.top : -1;
  request.speculative = s.speculative;
  request.n = gen.n;
  request.prompt_logprobs = prompt_logprobs;

  std::shared_ptr<Generation> generation;
  parse->inc(seconds_since(arrived));
  try {
    generation = scheduler->submit(request);
  } catch (const Error& e) {  // a request the engine can never run: the client's to fix
    return send_error(res, ApiError(400, e.what(), "prompt", "invalid_value"));
  }
  if (!generation) {
    res.set_header("Retry-After", "1");
    return send_error(res, ApiError(503, "the server is at capacity: every queue slot is taken; retry shortly", "",
                                    "server_busy", "server_error"));
  }

  // A stream's status line waits for the engine's first token, up to one heartbeat interval: a
  // request that fails before it (refused at admission, a failed prompt lookup or a quick
  // prefill) gets 500, not 200 with an error event. Longer it cannot wait: until a byte goes out,
  // a stream's client that has gone away is not noticed. The events taken meanwhile go to the
  // provider. A plain response needs no wait: its status goes out with the whole reply.
  const bool stream = gen.stream;
  std::vector<GenerationEvent> taken;
  for (const auto until = Steady::now() + std::chrono::milliseconds(stream ? options.heartbeat_ms : 0);;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Steady::now());
    if (left.count() <= 0) break;
    std::optional<GenerationEvent> e = generation->next_for(left);
    if (!e) break;
    if (e->kind == GenerationEvent::Kind::Finished && e->finish == FinishKind::Error) {
      duration->observe(seconds_since(arrived));
      return send_error(res, ApiError(500, "the engine failed: " + e->error, "", "", "server_error"));
    }
    taken.push_back(std::move(*e));
    if (taken.back().kind != GenerationEvent::Kind::Prefilled) break;
  }

  // A stream is written by a content provider, so that a client that goes away is noticed at the
  // next write and its sequence freed at once: every delta, and after a second with nothing
  // written an SSE comment. A plain response is built by the same provider here, on the
  // connection's thread, into a string: a client that goes away meanwhile is noticed on its
  // socket (client_gone), and the status goes out with the reply, 500 if the engine failed.
  const ResponseMeta meta = new_response_meta(chat ? "chatcmpl" : "cmpl", gen.model);
  // Each choice's reply: its text, cut at its own stop string, and what the response says of it.
  struct Choice {
    ReplyStream reply;
    ChatChoice chat;
    CompletionChoice completion;
    std::vector<TokenLogprob> logprobs;
    int64_t text_offset = 0;
    bool answered = false, reasoned = false;  // what the reply has said: for ChatDelta::reasoning_only
  };
  auto choices = std::make_shared<std::vector<Choice>>();
  choices->reserve(size_t(gen.n));
  for (int k = 0; k < gen.n; ++k) {
    choices->push_back(Choice{ReplyStream(*tokenizer, gen.sampling.stop, chat, thinking, request.top_logprobs), {}, {}, {}});
    choices->back().chat.index = choices->back().completion.index = k;
  }
  const int64_t prompt_tokens = int64_t(request.prompt.size()), image_tokens = image_span_tokens(request.images);
  access.prompt_tokens = prompt_tokens;
  const bool include_usage = gen.include_usage;
  const int connection = stream ? -1 : connection_socket(req);
  auto failure = std::make_shared<std::optional<ApiError>>();  // a plain response's engine failure
  auto provider = [this, generation, choices, meta, chat, stream, include_usage, prompt_tokens, image_tokens, arrived, connection,
                   echo, failure, taken = std::move(taken)](size_t, httplib::DataSink& sink) mutable {
    Usage usage{prompt_tokens, 0, 0};
    usage.image_tokens = image_tokens;
    int finished = 0;
    bool first_token = true, gone = false;
    auto last_write = Steady::now();
    auto write = [&](const std::string& text) {
      if (!gone && !sink.write(text.data(), text.size())) {
        gone = true;
        generation->cancel();
      }
      last_write = Steady::now();
      return !gone;
    };
    auto emit = [&](Choice& c, ReplyStream::Delta d) {
      if (d.empty()) return;
      c.answered = c.answered || !d.text.empty() || !d.tool_calls.empty();
      c.reasoned = c.reasoned || !d.reasoning.empty();
      if (!stream) {
        c.chat.content += d.text;
        c.chat.reasoning_content += d.reasoning;
        c.completion.text += d.text;
        c.chat.tool_calls.insert(c.chat.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
        c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
        return;
      }
      std::optional<std::vector<TokenLogprob>> lp;
      if (!d.logprobs.empty()) lp = d.logprobs;
      if (chat) {
        ChatDelta cd;
        cd.index = c.chat.index;
        if (!d.text.empty()) cd.content = d.text;
        if (!d.reasoning.empty()) cd.reasoning_content = d.reasoning;
        for (size_t i = 0; i < d.tool_calls.size(); ++i)
          cd.tool_calls.push_back({int(c.chat.tool_calls.size() + i), d.tool_calls[i].id, d.tool_calls[i].name, d.tool_calls[i].arguments});
        c.chat.tool_calls.insert(c.chat.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
        cd.logprobs = lp;
        write(sse_event(chat_chunk_json(meta, cd, include_usage)));
      } else {
        CompletionDelta cd{c.completion.index, d.text, std::nullopt, lp, c.text_offset};
        for (const TokenLogprob& t : d.logprobs) c.text_offset += code_points(t.token);
        write(sse_event(completion_chunk_json(meta, cd, include_usage)));
      }
    };
    // Echo: each choice starts with the prompt's text, and with prompt logprobs (the first token's
    // null) with its tokens' logprobs too — sent once they are all in (PromptToken events).
    const std::vector<int>& prompt = generation->request.prompt;
    std::vector<TokenLogprob> prompt_logprobs;
    if (generation->request.prompt_logprobs >= 0) prompt_logprobs.push_back({token_text(*tokenizer, prompt[0]), 0, {}, true});
    auto send_echo = [&] {
      if (!echo) return;
      for (Choice& c : *choices) emit(c, ReplyStream::Delta{*echo, {}, {}, prompt_logprobs});
      echo.reset();
    };
    if (generation->request.prompt_logprobs < 0 || prompt.size() == 1) send_echo();
    for (Choice& c : *choices) {
      if (stream && chat) {
        ChatDelta role;
        role.index = c.chat.index;
        role.role = true;
        role.content = "";
        write(sse_event(chat_chunk_json(meta, role, include_usage)));
      }
    }
    for (size_t next_taken = 0;;) {
      std::optional<GenerationEvent> e;
      if (next_taken < taken.size()) e = std::move(taken[next_taken++]);
      else e = generation->next_for(std::chrono::milliseconds(std::min(250, options.heartbeat_ms)));
      // Whether the client is still there: a stream learns it from a byte that costs the client
      // nothing after a silence (ServerOptions::heartbeat_ms), a plain response from its socket.
      if (stream && seconds_since(last_write) * 1000 >= options.heartbeat_ms) write(": keep-alive\n\n");
      if (!stream && !gone && client_gone(connection)) gone = true, generation->cancel();
      if (!e) continue;
      if (e->kind == GenerationEvent::Kind::Prefilled) {
        usage.cached_tokens = e->use.cached();
        usage.replayed_tokens = e->use.replayed;
        access.cached_tokens = usage.cached_tokens;
        continue;
      }
      if (e->kind == GenerationEvent::Kind::PromptToken) {
        prompt_logprobs.push_back(ReplyStream::logprob(*tokenizer, e->token));
        if (prompt_logprobs.size() == prompt.size()) send_echo();
        continue;
      }
      send_echo();  // (sent already, unless the prompt's scoring ended early)
      Choice& c = choices->at(size_t(e->choice));
      if (e->kind == GenerationEvent::Kind::Token) {
        if (c.reply.stopped()) continue;  // generated after the stop string, before the cancel took
        if (first_token) ttft->observe(access.ttft_s = seconds_since(arrived)), first_token = false;
        usage.completion_tokens += 1;
        access.output_tokens = usage.completion_tokens;
        emit(c, c.reply.push(e->token));
        if (c.reply.stopped()) generation->cancel(e->choice);
        continue;
      }
      if (gone) {  // every choice's Finished is awaited: the sequences are freed before the handler returns
        if (++finished < int(choices->size())) continue;
        duration->observe(seconds_since(arrived));
        return false;
      }
      if (e->finish == FinishKind::Error) {
        duration->observe(seconds_since(arrived));
        generation->cancel();  // the other choices: the request has failed
        const ApiError err(500, "the engine failed: " + e->error, "", "", "server_error");
        if (!stream) {  // the handler sends it, with its status
          *failure = err;
          return true;
        }
        write(sse_event(err.body()) + sse_done());
        sink.done();
        return true;
      }
      emit(c, c.reply.finish());
      const FinishReason why = finish_reason(e->finish, c.reply);
      c.chat.finish_reason = c.completion.finish_reason = why;
      if (generation->request.top_logprobs >= 0) c.chat.logprobs = c.completion.logprobs = c.logprobs;
      if (stream) {
        if (chat) {
          ChatDelta end;
          end.index = c.chat.index;
          end.finish_reason = why;
          end.reasoning_only = c.reasoned && !c.answered;
          write(sse_event(chat_chunk_json(meta, end, include_usage)));
        } else {
          write(sse_event(completion_chunk_json(meta, CompletionDelta{c.completion.index, "", why, std::nullopt, c.text_offset}, include_usage)));
        }
      }
      if (++finished < int(choices->size())) continue;
      duration->observe(seconds_since(arrived));
      if (stream) {
        if (include_usage) write(sse_event(chat ? chat_usage_chunk_json(meta, usage) : completion_usage_chunk_json(meta, usage)));
        write(sse_done());
      } else if (chat) {
        std::vector<ChatChoice> all;
        for (const Choice& x : *choices) all.push_back(x.chat);
        write(json_text(chat_completion_json(meta, all, usage)));
      } else {
        std::vector<CompletionChoice> all;
        for (const Choice& x : *choices) all.push_back(x.completion);
        write(json_text(text_completion_json(meta, all, usage)));
      }
      if (!gone) sink.done();
      return !gone;
    }
  };
  res.set_header("Cache-Control", "no-cache");
  if (stream) return res.set_chunked_content_provider("text/event-stream", provider);
  std::string body;
  httplib::DataSink sink;
  sink.write = [&body](const char* data, size_t size) {
    body.append(data, size);
    return true;
  };
  sink.done = [] {};
  if (!provider(0, sink)) return;  // the client went away: nobody to answer
  if (*failure) return send_error(res, **failure);
  res.set_content(body, "application/json");
}

// Counters mirror cumulative totals kept by the engine: each scrape adds what is new.
static void sync(Counter& c, double total) {
  if (total > c.value()) c.inc(total - c.value());
}

std::string Server::State::render_metrics() {
  std::lock_guard lock(scrape);
  MetricsRegistry& m = metrics;
  m.gauge("dsv41_ready", "1 once the model is loaded").set(ready ? 1 : 0);
  if (!ready) return m.render();
  m.gauge("dsv41_executor_info", "1, labelled with the executor the model runs on", {{"device", executor->name()}}).set(1);
  m.gauge("dsv41_warm_up_seconds", "The warm-up's time before the server said ready (0: none ran)").set(warm_up_seconds);
  const SchedulerStats s = scheduler->stats();
  sync(m.counter("dsv41_requests_total", "Requests admitted to the scheduler"), double(s.requests));
  sync(m.counter("dsv41_requests_refused_total", "Requests refused with 503: the queue was full"), double(s.refused));
  sync(m.counter("dsv41_requests_cancelled_total", "Requests whose client went away or that hit a stop string"), double(s.cancelled));
  sync(m.counter("dsv41_requests_failed_total", "Requests the engine failed"), double(s.failed));
  sync(m.counter("dsv41_prompt_tokens_total", "Prompt tokens of admitted requests"), double(s.prompt_tokens));
  sync(m.counter("dsv41_prefill_tokens_total", "Prompt rows run: computed and replayed, not cached"), double(s.prefill_tokens));
  sync(m.counter("dsv41_generation_tokens_total", "Tokens generated"), double(s.decode_tokens));
  sync(m.counter("dsv41_prefill_seconds_total", "Step time spent on prompt rows"), s.prefill_seconds);
  sync(m.counter("dsv41_decode_seconds_total", "Step time spent on decode rows"), s.decode_seconds);
  sync(m.counter("dsv41_steps_total", "Scheduler steps (batched forward calls)"), double(s.steps));
  sync(m.counter("dsv41_prompt_lookup_seconds_total", "Time looking prompts up in the KV tiers and restoring the hits"),
       s.lookup_seconds);
  sync(m.counter("dsv41_kv_store_seconds_total", "Time storing blocks and SWA tails into the KV tiers"), s.store_seconds);
  sync(m.counter("dsv41_queue_wait_seconds_total", "Time requests waited from submission to admission"), s.queue_seconds);
  m.gauge("dsv41_prefill_tokens_per_second", "Prompt tokens run per second of prefill step time")
      .set(s.prefill_seconds > 0 ? double(s.prefill_tokens) / s.prefill_seconds : 0);
  m.gauge("dsv41_decode_tokens_per_second", "Tokens generated per second of decode step time")
      .set(s.decode_seconds > 0 ? double(s.decode_tokens) / s.decode_seconds : 0);
  m.gauge("dsv41_queue_depth", "Requests waiting to join the batch").set(double(s.queued));
  m.gauge("dsv41_running_sequences", "Sequences in the batch").set(double(s.running));
  m.gauge("dsv41_kv_bytes", "KV bytes the running and idle sequences hold (in the cache formats)").set(double(s.kv_bytes));
  m.gauge("dsv41_kv_budget_bytes", "The sequences' KV budget (0: none)").set(double(kv_budget));
  sync(m.counter("dsv41_preemptions_total", "Running sequences put back to wait for KV room"), double(s.preempted));
  m.gauge("dsv41_idle_sequences", "Finished sequences kept on the device for a continuation").set(double(s.idle));
  const SpeculationStats& sp = s.speculation;
  sync(m.counter("dsv41_spec_steps_total", "Speculative decode steps: drafts verified in one target pass"), double(sp.steps));
  sync(m.counter("dsv41_spec_plain_steps_total", "Decode steps of sequences that could speculate and decoded plainly: a draft would not pay"),
       double(sp.plain_steps));
  sync(m.counter("dsv41_spec_draft_tokens_total", "Draft tokens proposed"), double(sp.drafted));
  sync(m.counter("dsv41_spec_verified_tokens_total", "Draft tokens the prefix scheduler sent to the target"), double(sp.verified));
  sync(m.counter("dsv41_spec_accepted_tokens_total", "Draft tokens accepted"), double(sp.accepted));
  sync(m.counter("dsv41_spec_seconds_total", "Time drafting, verifying and undoing rejected positions"), sp.seconds());
  sync(m.counter("dsv41_spec_draft_seconds_total", "Time drafting (the drafter's calls)"), sp.draft_seconds);
  sync(m.counter("dsv41_spec_verify_seconds_total", "Time verifying and redoing (the target's passes)"), sp.verify_seconds);
  sync(m.counter("dsv41_spec_passes_total", "Target calls of speculative steps: each verifies every speculating sequence's draft, or redoes the rejected ones"),
       double(sp.passes));
  for (size_t k = 0; k < sp.accepted_at.size(); ++k)
    sync(m.counter("dsv41_spec_accepted_at_position_total", "Speculative steps whose draft at this position was accepted",
                   {{"position", std::to_string(k + 1)}}),
         double(sp.accepted_at[k]));
  m.gauge("dsv41_spec_mean_accepted", "Draft tokens accepted per speculative step")
      .set(sp.steps > 0 ? double(sp.accepted) / double(sp.steps) : 0);

  const KvCacheStats k = cache->stats();
  const char* hit_help = "Prompt tokens served from a KV tier instead of computed";
  sync(m.counter("dsv41_cache_hit_tokens_total", hit_help, {{"tier", "device"}}), double(k.counters.device_tokens));
  sync(m.counter("dsv41_cache_hit_tokens_total", hit_help, {{"tier", "host"}}), double(k.counters.host_tokens));
  sync(m.counter("dsv41_cache_hit_tokens_total", hit_help, {{"tier", "disk"}}), double(k.counters.disk_tokens));
  sync(m.counter("dsv41_cache_hit_tokens_total", hit_help, {{"tier", "swa_pool"}}), double(k.counters.swa_tokens));
  sync(m.counter("dsv41_cache_replayed_tokens_total", "Rows rerun to regenerate SWA KV (encoder bounded replay; exact mode's replay of every layer)"),
       double(k.counters.replayed_tokens));
  sync(m.counter("dsv41_cache_replay_seconds_total", "Time of the steps that ran an encoder replay"), k.counters.replay_seconds);
  sync(m.counter("dsv41_cache_short_hits_total", "Global hits not adopted: no longer than the replay they would need"), double(k.counters.short_hits));
  sync(m.counter("dsv41_store_write_errors_total", "Blocks the persistent store failed to write (disk full, I/O)"),
       double(k.counters.store_errors));
  sync(m.counter("dsv41_store_read_seconds_total",
                 "Time reading prompt blocks from the persistent store (part of the prompt lookup)"),
       k.counters.store_read_seconds);
  m.gauge("dsv41_host_cache_bytes", "Bytes of global-KV blocks in the host cache").set(double(k.host.bytes));
  m.gauge("dsv41_host_cache_blocks", "Global-KV blocks in the host cache").set(double(k.host.blocks));
  sync(m.counter("dsv41_host_cache_evictions_total", "Host-cache blocks evicted"), double(k.host.evictions));
  m.gauge("dsv41_swa_pool_bytes", "Bytes held by the SWA pool").set(double(k.swa.bytes));
  m.gauge("dsv41_swa_pool_entries", "Entries held by the SWA pool").set(double(k.swa.entries));
  sync(m.counter("dsv41_swa_pool_ttl_expiries_total", "SWA-pool entries released because their TTL ran out"), double(k.swa.ttl_expiries));
  sync(m.counter("dsv41_swa_pool_evictions_total", "Live SWA-pool entries evicted for room"), double(k.swa.evictions));
  sync(m.counter("dsv41_swa_pool_lookups_total", "SWA-pool lookups of a prompt", {{"result", "hit"}}), double(k.swa.hits));
  sync(m.counter("dsv41_swa_pool_lookups_total", "SWA-pool lookups of a prompt", {{"result", "miss"}}), double(k.swa.misses));
  sync(m.counter("dsv41_swa_pool_traffic_bytes_total", "Bytes sent to and read from the SWA pool's memcached servers", {{"direction", "out"}}),
       double(k.swa.bytes_written));
  sync(m.counter("dsv41_swa_pool_traffic_bytes_total", "Bytes sent to and read from the SWA pool's memcached servers", {{"direction", "in"}}),
       double(k.swa.bytes_read));
  sync(m.counter("dsv41_swa_pool_server_errors_total", "SWA-pool operations a memcached server failed (read as misses)"),
       double(k.swa.server_errors));
  sync(m.counter("dsv41_swa_pool_torn_total", "SWA-pool tails found incomplete or failing their checksum (read as misses)"), double(k.swa.torn));
  if (k.store) {
    m.gauge("dsv41_store_bytes", "Bytes of the persistent store's block files").set(double(k.store->bytes));
    m.gauge("dsv41_store_blocks", "Blocks in the persistent store").set(double(k.store->blocks));
    m.gauge("dsv41_store_oldest_block_age_seconds", "Age of the persistent store's oldest block").set(double(k.store->oldest_age_ms) / 1e3);
    sync(m.counter("dsv41_store_refused_writes_total", "Writes refused: the budget was full of blocks younger than the lifetime"),
         double(k.store->refused_writes));
    sync(m.counter("dsv41_store_evictions_total", "Blocks older than the lifetime evicted for room"), double(k.store->evictions));
    sync(m.counter("dsv41_store_dropped_files_total", "Damaged or foreign block files deleted (at open or when read)"),
         double(k.store->dropped_files));
  }
  return m.render();
}

void Server::State::routes() {
  // The chat page needs no key: it holds no data, and asks for the key its API requests send.
  for (const char* path : {"/", "/index.html"})
    route("GET", path, [](const httplib::Request&, httplib::Response& res) {
      const std::string_view page = chat_page();
      res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
    });
  route("GET", "/health", [this](const httplib::Request&, httplib::Response& res) {
    res.status = ready ? 200 : 503;
    res.set_content(json_text(json{{"status", ready ? "ok" : "loading"}}), "application/json");
  });
  route("GET", "/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_metrics(), kMetricsContentType);
  });
  route("GET", "/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const ModelCard card{options.model_name, created};
    res.set_content(json_text(models_json(std::span(&card, 1))), "application/json");
  });
  // The path's rest is the id (model ids may hold '/', as Hugging Face names do).
  route("GET", R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    const std::string id = req.matches[1];
    if (id != options.model_name)
      return send_error(res, ApiError(404, "model: expected " + json_text(options.model_name) + ", found " + json_text(id), "model",
                                      "model_not_found"));
    res.set_content(json_text(model_json(ModelCard{options.model_name, created})), "application/json");
  });
  route("POST", "/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) generate(req, res, true);
  });
  route("POST", "/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    if (authorized(req, res)) generate(req, res, false);
  });
  // vLLM's tokenizer endpoints: a prompt's token ids as a completion or a chat request would run
  // them, and token ids back to text.
  route("POST", "/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    if (!ready) return send_error(res, ApiError(503, "the model is loading", "", "model_loading", "server_error"));
    try {
      const TokenizeRequest r = parse_tokenize_request(req.body, api);
      bool thinking = false;
      std::vector<PromptImage> images;
      const std::vector<int> tokens = r.chat ? chat_prompt(*r.chat, thinking, images) : tokenizer->encode(*r.prompt, r.add_special_tokens);
      res.set_content(json_text(tokenize_json(tokens, model->config().max_seq_len)), "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  route("POST", "/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    if (!ready) return send_error(res, ApiError(503, "the model is loading", "", "model_loading", "server_error"));
    try {
      const std::vector<int32_t> tokens = parse_detokenize_request(req.body, api);
      res.set_content(json_text(json{{"prompt", tokenizer->decode(std::vector<int>(tokens.begin(), tokens.end()), false)}}),
                      "application/json");
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http.set_pre_routing_handler([](const httplib::Request&, httplib::Response&) {
    access = AccessRecord{true, Steady::now()};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    http_responses(res.status).inc();
    if (options.log_format != LogFormat::Off) {
      AccessEntry e{req.method, req.path, req.remote_addr, res.status, access.prompt_tokens, access.cached_tokens,
                    access.output_tokens, access.ttft_s < 0 ? -1 : access.ttft_s * 1e3,
                    access.started ? seconds_since(access.arrived) * 1e3 : 0,
                    std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count()};
      const std::string line = access_line(options.log_format, e);
      if (options.access_log) {
        options.access_log(line);
      } else {
        static std::mutex out;
        std::lock_guard hold(out);
        std::fprintf(stderr, "%s\n", line.c_str());
        std::fflush(stderr);
      }
    }
    access = AccessRecord{};
  });
  // The errors cpp-httplib answers itself, said as a client can act on them: a route under another
  // method is 405 with Allow, not 404; a body, URI or request beyond the limits says which.
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message, code;
    if (res.status == 404 && methods.count(req.path)) {
      res.status = 405;
      res.set_header("Allow", methods.at(req.path));
      message = req.path + ": expected method " + methods.at(req.path) + ", found " + req.method;
      code = "method_not_allowed";
    } else if (res.status == 404) {
      message = "no route " + req.method + " " + req.path;
      code = "not_found";
    } else if (res.status == 413) {
      message = "request body: expected at most " + std::to_string(kMaxBodyBytes >> 20) + " MiB, found more";
      code = "request_too_large";
    } else if (res.status == 414) {
      message = "request URI: expected at most " + std::to_string(CPPHTTPLIB_REQUEST_URI_MAX_LENGTH) + " bytes, found more";
      code = "uri_too_long";
    } else {
      message = "request: expected a well-formed HTTP/1.1 request, found HTTP status " + std::to_string(res.status);
      code = "invalid_request";
    }
    res.set_content(json_text(ApiError(res.status, message, "", code).body()), "application/json");
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError(500, "internal error: " + what, "", "", "server_error"));
  });
}

Server::Server(ServerOptions options) : state_(std::make_unique<State>()) {
  // Request bodies of many MB (up to kMaxBodyBytes) are read by many handler threads. glibc's
  // malloc raises its mmap threshold once such a buffer is freed and then keeps each later one in
  // a thread's arena: 50 rejected 10 MB bodies left the RSS ~390 MB higher. A fixed threshold keeps
  // every buffer of 4 MiB or more in a mapping of its own, returned when it is freed.
  mallopt(M_MMAP_THRESHOLD, 4 << 20);
  if (options.heartbeat_ms < 1) fail("server", "a heartbeat of at least 1 ms", std::to_string(options.heartbeat_ms) + " ms");
  if (!(options.kv_budget_gb < 1e9)) fail("--kv-budget-gb", "a budget below 1e9 GB", std::to_string(options.kv_budget_gb));
  if (options.model_name.empty()) options.model_name = std::filesystem::path(options.model_dir).filename().string();
  if (options.model_name.empty()) options.model_name = "dsv41";
  state_->options = std::move(options);
  state_->created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  state_->ttft = &state_->metrics.histogram("dsv41_time_to_first_token_seconds", "From a request's arrival to its first token",
                                            {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30});
  state_->duration = &state_->metrics.histogram("dsv41_request_duration_seconds", "From a request's arrival to its last byte",
                                                {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300});
  state_->parse = &state_->metrics.counter("dsv41_request_parse_seconds_total",
                                           "From a generation request's arrival to its submission: parsing, rendering, tokenizing");
  // A handler waits on its request for the whole generation: enough threads for every running
  // and queued request, a few for /health and /metrics, and kSlowConnections for connections
  // still sending their request: a client that sends a header line a second holds its thread as
  // long as it likes (cpp-httplib times out each read, not the request), and without these 150
  // such clients starved /health.
  const SchedulerOptions& s = state_->options.scheduler;
  const size_t threads = size_t(s.max_running + s.max_queued + 8) + kSlowConnections;
  state_->http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  state_->http.set_payload_max_length(kMaxBodyBytes);
  state_->routes();
}

Server::~Server() { stop(); }

void Server::stop() {
  // The scheduler first: it finishes every request, so that no handler waits on a generation
  // while the HTTP server joins its threads.
  if (state_->ready) state_->scheduler->stop();
  state_->http.stop();
}

void Server::run() {
  State& st = *state_;
  // SO_REUSEADDR only: a restart may bind while old connections linger in TIME_WAIT. cpp-httplib's
  // default adds SO_REUSEPORT, under which a second server binds the same port and the kernel
  // splits the clients between the two.
  st.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // The store's directory first: a second server on it fails here, before it says it listens.
  if (!st.options.cache.store_dir.empty()) st.store_lock = std::make_shared<StoreLock>(st.options.cache.store_dir);
  const int port = st.options.port == 0 ? st.http.bind_to_any_port(st.options.host) : st.options.port;
  if (st.options.port != 0 && !st.http.bind_to_port(st.options.host, port))
    fail("serve", "a free address to listen on", st.options.host + ":" + std::to_string(port) + " (in use, or not ours)");
  if (port < 0) fail("serve", "a free port on " + st.options.host, "none");
  if (::listen(st.http.listening_socket(), kListenBacklog) != 0)
    fail("serve", "a listening socket that takes a backlog of " + std::to_string(kListenBacklog), std::strerror(errno));
  port_ = port;
  if (st.options.on_listening) st.options.on_listening(port);
  std::thread loader([&st] {
    try {
      if (st.options.before_load) st.options.before_load();
      st.load();
    } catch (const std::exception& e) {
      st.load_error = e.what();
      // stop() only stops a server that runs: wait (briefly) for the listener to start.
      for (int i = 0; i < 5000 && !st.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      st.http.stop();
    }
  });
  st.http.listen_after_bind();
  loader.join();
  if (!st.load_error.empty()) throw Error(st.load_error);
}

}  // namespace dsv41
