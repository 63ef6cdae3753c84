// The HTTP server end to end on loopback, with fixture v41-tiny: a multi-turn conversation whose
// cached tokens grow turn by turn, an SWA miss after the TTL answered by encoder replay, the
// metrics that say so, health while loading, authentication, a client that goes away; then the
// official `openai` npm client (tests/e2e) against the same server, and the bounded load test.
#include <gtest/gtest.h>
#include <httplib.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>

#include "base/error.h"
#include "fixture.h"
#include "forward/model.h"
#include "model/accounting.h"
#include "model/config.h"
#include "model/tokenizer/tokenizer.h"
#include "server/openai_api.h"
#include "server/server.h"
#include "running_server.h"
#include "test_device.h"
#include "test_util.h"

using namespace dsv41;
using json = nlohmann::json;

namespace {

using Running = test::RunningServer;

json chat(const json& messages, int max_tokens) {
  return {{"model", "v41-tiny"},
          {"messages", messages},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"chat_template_kwargs", {{"thinking", false}}}};
}

}  // namespace

TEST(Server, CachedTokensGrowAcrossTurnsAndReplayAfterTheTtl) {
  ServerOptions options;
  options.cache.swa.ttl_ms = 4000;  // long enough for three turns on a loaded CI machine
  Running server(options);
  json messages = json::array({{{"role", "system"}, {"content", "You answer questions about the sea, briefly and kindly."}}});
  const std::vector<std::string> questions = {"Why is the sea salty?", "And why is it blue?", "Which sea is the largest?"};
  int64_t cached_before = -1, prompt_before = 0;
  for (const std::string& q : questions) {
    messages.push_back({{"role", "user"}, {"content", q}});
    json r = server.post("/v1/chat/completions", chat(messages, 8));
    const int64_t cached = r["usage"]["prompt_tokens_details"]["cached_tokens"], prompt = r["usage"]["prompt_tokens"];
    EXPECT_GT(cached, cached_before) << r;
    EXPECT_EQ(r["usage"]["prompt_tokens_details"]["replayed_tokens"], 0) << "served exactly: " << r;
    if (cached_before >= 0) {
      EXPECT_GE(cached, prompt_before) << "the previous turn's prompt is cached";
    }
    cached_before = cached;
    prompt_before = prompt;
    messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
  }
  EXPECT_EQ(server.metric("dsv41_cache_replayed_tokens_total"), 0);

  // After the TTL the SWA state of the conversation is gone (pool and idle sequence): the next
  // turn's prefix comes from the global blocks, with the encoder replaying W positions.
  std::this_thread::sleep_for(std::chrono::milliseconds(4200));
  messages.push_back({{"role", "user"}, {"content", "Thank you!"}});
  json r = server.post("/v1/chat/completions", chat(messages, 4));
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 64) << r;
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["replayed_tokens"], 16) << r;  // W of v41-tiny, in the response
  EXPECT_EQ(server.metric("dsv41_cache_replayed_tokens_total"), 16);          // and in the metrics
  EXPECT_GE(server.metric("dsv41_swa_pool_ttl_expiries_total"), 1);
  EXPECT_GT(server.metric("dsv41_cache_hit_tokens_total{tier=\"host\"}"), 0);
  EXPECT_GT(server.metric("dsv41_cache_hit_tokens_total{tier=\"swa_pool\"}"), 0);
}

// /health says 503 while the model loads, then 200; generation requests get 503 meanwhile.
TEST(Server, HealthIsUnavailableWhileLoading) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<int> listening;
  ServerOptions options;
  options.model_dir = test::fixture_dir("v41-tiny");
  options.device = test::test_device();
  options.ranks = test::test_ranks();
  options.port = 0;
  options.on_listening = [&](int port) { listening.set_value(port); };
  options.before_load = [released] { released.wait(); };
  Server server(options);
  std::thread thread([&] { server.run(); });
  httplib::Client c("127.0.0.1", listening.get_future().get());
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(json::parse(r->body)["status"], "loading");
  r = c.Post("/v1/completions", R"({"model":"v41-tiny","prompt":"hi"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  release.set_value();
  int status = 0;
  for (int i = 0; i < 2000 && status != 200; ++i) {
    auto h = c.Get("/health");
    status = h ? h->status : 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(status, 200);
  server.stop();
  thread.join();
}

// The load reports its steps (dsv41 serve draws them as a progress line on a terminal), the last
// once the model is ready.
TEST(Server, LoadingReportsItsSteps) {
  std::mutex mutex;
  std::vector<std::tuple<std::string, int, int>> steps;
  ServerOptions options;
  options.on_load_step = [&](const std::string& step, int done, int total) {
    std::lock_guard lock(mutex);
    steps.emplace_back(step, done, total);
  };
  Running server(options);
  std::lock_guard lock(mutex);
  const std::vector<std::tuple<std::string, int, int>> expected = {
      {"the checkpoint", 0, 5}, {"the weights to the executor", 1, 5}, {"the tokenizer", 2, 5}, {"the KV tiers", 3, 5},
      {"the warm-up", 4, 5}, {"ready", 5, 5}};
  EXPECT_EQ(steps, expected);
}

// The warm-up (engine/warm_up.h) serves its requests before the server says ready, and leaves no
// trace but its time: no request, prompt token or generated token in the metrics, no block in the
// host cache or the store, nothing running or idle; the first client's request is served as on a
// server without it. Forced on here (auto runs it on CUDA only).
TEST(Server, TheWarmUpLeavesNothingBehind) {
  test::TempDir dir("server_warm_up");
  ServerOptions options;
  options.warm_up = ServerOptions::WarmUp::On;
  options.cache.store_dir = dir.string();
  options.cache.store_budget_bytes = 64 << 20;
  Running server(options);
  EXPECT_GT(server.metric("dsv41_warm_up_seconds"), 0);
  EXPECT_EQ(server.metric("dsv41_requests_total"), 0);
  EXPECT_EQ(server.metric("dsv41_prompt_tokens_total"), 0);
  EXPECT_EQ(server.metric("dsv41_generation_tokens_total"), 0);
  EXPECT_EQ(server.metric("dsv41_host_cache_blocks"), 0);
  EXPECT_EQ(server.metric("dsv41_store_blocks"), 0);
  EXPECT_EQ(server.metric("dsv41_running_sequences"), 0);
  EXPECT_EQ(server.metric("dsv41_idle_sequences"), 0);
  std::vector<int> prompt(100);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + int(i * 7919 % 400);
  json r = server.post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", prompt}, {"max_tokens", 3}, {"ignore_eos", true}});
  EXPECT_EQ(r["usage"]["completion_tokens"], 3) << r;
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << r;
  EXPECT_EQ(server.metric("dsv41_requests_total"), 1);
}

TEST(Server, RefusesBadRequestsAndKeepsServing) {
  ServerOptions options;
  options.api_key = "sesame";
  Running server(options);
  httplib::Client c = server.client();
  auto r = c.Post("/v1/completions", R"({"model":"v41-tiny","prompt":"hi"})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "invalid_api_key");
  httplib::Headers auth = {{"Authorization", "Bearer sesame"}};
  r = c.Post("/v1/completions", auth, R"({"model":"v41-tiny","prompt":"hi","max_tokens":100000})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "context_length_exceeded");
  r = c.Post("/v1/chat/completions", auth, R"({"model":"v41-tiny","messages":[{"role":"wizard","content":"x"}]})",
             "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("wizard"), std::string::npos) << r->body;
  r = c.Get("/v1/nothing-here", auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  // One model by id (the SDKs' models.retrieve): this one, or 404 model_not_found.
  r = c.Get("/v1/models/v41-tiny", auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["id"], "v41-tiny");
  EXPECT_EQ(json::parse(r->body)["object"], "model");
  r = c.Get("/v1/models/other/model", auth);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_not_found");
  EXPECT_EQ(c.Get("/v1/models/v41-tiny")->status, 401);
  r = c.Post("/v1/completions", auth, R"({"model":"v41-tiny","prompt":"hi","max_tokens":2,"ignore_eos":true})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 2);
}

// A streaming client that hangs up frees its sequence at once: the next write fails and the
// scheduler drops it at its next step.
TEST(Server, AClientThatGoesAwayFreesItsSequence) {
  Running server(ServerOptions{});
  {
    httplib::Client c = server.client();
    int chunks = 0;
    // ignore_eos: the tiny model samples its end token now and then, which would end the
    // reply (not cancel it) before the hang-up reaches the scheduler.
    const json body = {{"model", "v41-tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"stream", true},
                       {"ignore_eos", true}};
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };  // hang up
    c.send(req);
    EXPECT_EQ(chunks, 3);
  }
  // Up to 30 s: on a loaded machine (the suite runs tests in parallel) the hang-up can take
  // seconds to reach the scheduler. A request that is never cancelled still ends within the wait
  // (3000 tokens at the tiny model's speed), and the cancel count below catches it.
  for (int i = 0; i < 3000 && server.metric("dsv41_running_sequences") > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.metric("dsv41_running_sequences"), 0);
  EXPECT_EQ(server.metric("dsv41_requests_cancelled_total"), 1);
}

// A TCP connection to 127.0.0.1:port, or -1.
int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// What one raw HTTP request (written as it is, for requests a client library will not send) gets
// back: the status line's code and the body. The request should ask for "Connection: close", so
// that the reply ends with the connection (a half-closed socket is dropped unanswered).
std::pair<int, std::string> raw_request(int port, const std::string& request) {
  const int fd = connect_loopback(port);
  if (fd < 0) return {-1, "connect failed"};
  for (size_t at = 0; at < request.size();) {
    const ssize_t n = ::write(fd, request.data() + at, request.size() - at);
    if (n <= 0) break;
    at += size_t(n);
  }
  std::string reply;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) reply.append(buf, size_t(n));
  ::close(fd);
  const size_t space = reply.find(' '), body = reply.find("\r\n\r\n");
  if (space == std::string::npos || body == std::string::npos) return {-1, reply};
  return {std::atoi(reply.c_str() + space + 1), reply.substr(body + 4)};
}

// The errors cpp-httplib answers by itself carry what a client can act on: a route under the
// wrong method is 405 naming the right one (it was 404 "no route"), an oversized body 413, an
// oversized URI 414, a malformed request 400, each with an OpenAI error body.
TEST(Server, HttpErrorsSayWhatWasWrong) {
  Running server(ServerOptions{});
  httplib::Client c = server.client();
  auto r = c.Post("/health", "", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET");
  EXPECT_EQ(json::parse(r->body)["error"]["message"], "/health: expected method GET, found POST");
  r = c.Get("/v1/chat/completions");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "POST");
  r = c.Get("/v1/nothing");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "not_found");

  const size_t over = (size_t(64) << 20) + 1;  // one byte past the limit
  auto [status, body] = raw_request(server.port(), "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                                   "Content-Type: application/json\r\nContent-Length: " + std::to_string(over) +
                                                   "\r\n\r\n" + std::string(over, ' '));
  EXPECT_EQ(status, 413) << body;
  EXPECT_NE(body.find("request body: expected at most 64 MiB"), std::string::npos) << body;
  std::tie(status, body) =
      raw_request(server.port(), "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status, 414) << body;
  EXPECT_NE(body.find("uri_too_long"), std::string::npos) << body;
  std::tie(status, body) = raw_request(server.port(), "NONSENSE\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(status, 400) << body;
  EXPECT_NE(body.find("invalid_request"), std::string::npos) << body;
  // And the server goes on serving.
  EXPECT_EQ(server.post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", "Once"}, {"max_tokens", 2}})["object"], "text_completion");
}

// A restart loses the host cache and the SWA pool, not the persistent store: the restarted server
// serves the conversation's prefix from disk (with encoder replay over W), and says so.
TEST(Server, ARestartedServerServesThePrefixFromDisk) {
  test::TempDir dir("server_restart");
  ServerOptions options;
  options.cache.store_dir = dir.string();
  options.cache.store_budget_bytes = 64 << 20;
  std::vector<int> prompt(300);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + int(i * 7919 % 400);
  {
    Running first(options);
    first.post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", prompt}, {"max_tokens", 2}});
  }
  prompt.insert(prompt.end(), {7, 8, 9, 10});
  Running second(options);
  json r = second.post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", prompt}, {"max_tokens", 2}});
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 256) << r;  // the whole blocks of the first prompt
  EXPECT_GE(second.metric("dsv41_cache_hit_tokens_total{tier=\"disk\"}"), 256);
  EXPECT_EQ(second.metric("dsv41_cache_hit_tokens_total{tier=\"host\"}"), 0);
  EXPECT_EQ(second.metric("dsv41_cache_replayed_tokens_total"), 16);  // W of v41-tiny
  EXPECT_GT(second.metric("dsv41_store_read_seconds_total"), 0);      // the lookup's reads of the store
}

// A damaged block file in the store is dropped when the server opens it, and counted where an
// operator looks (it used to vanish without a trace).
TEST(Server, DamagedStoreFilesAreCounted) {
  test::TempDir dir("server_store");
  std::filesystem::create_directories(dir / "3f");
  std::ofstream(dir / "3f" / "3f000000000000000000000000000000.blk") << "not a block";
  ServerOptions options;
  options.cache.store_dir = dir.string();
  options.cache.store_budget_bytes = 1 << 20;
  Running server(options);
  EXPECT_EQ(server.metric("dsv41_store_dropped_files_total"), 1);
  EXPECT_FALSE(std::filesystem::exists(dir / "3f" / "3f000000000000000000000000000000.blk"));
}

// Structured output through the HTTP server: a json_schema reply on the random-weight fixture
// finishes with "stop" and is a JSON object of the schema (the grammar guarantees it, not the
// model); a required tool call comes back as a call of the listed function with its arguments;
// a schema keyword outside the subset is a 400 naming it.
TEST(Server, StructuredOutputThroughTheServer) {
  Running server(ServerOptions{});
  const json schema = {{"type", "object"},
                       {"properties", {{"name", {{"type", "string"}, {"maxLength", 12}}},
                                       {"age", {{"type", "integer"}, {"minimum", 0}, {"maximum", 150}}},
                                       {"pet", {{"enum", {"cat", "dog", "fish"}}}}}},
                       {"required", {"name", "age", "pet"}},
                       {"additionalProperties", false}};
  json body = chat(json::array({{{"role", "user"}, {"content", "Describe a person as JSON."}}}), 200);
  body["temperature"] = 1.0;
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}, {"strict", true}}}};
  for (int i = 0; i < 3; ++i) {
    body["seed"] = i + 1;
    const json r = server.post("/v1/chat/completions", body);
    ASSERT_EQ(r["choices"][0]["finish_reason"], "stop") << r;
    const json reply = json::parse(r["choices"][0]["message"]["content"].get<std::string>());
    ASSERT_TRUE(reply.is_object()) << reply;
    EXPECT_EQ(reply.size(), 3u) << reply;
    ASSERT_TRUE(reply["name"].is_string()) << reply;
    const std::string name = reply["name"];
    // maxLength counts characters (code points): the UTF-8 bytes that are not continuations.
    EXPECT_LE(std::count_if(name.begin(), name.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }), 12) << reply;
    EXPECT_TRUE(reply["age"].is_number_integer() && reply["age"].get<int>() >= 0 && reply["age"].get<int>() <= 150) << reply;
    EXPECT_TRUE(reply["pet"] == "cat" || reply["pet"] == "dog" || reply["pet"] == "fish") << reply;
  }

  json tools = json::array({{{"type", "function"},
                             {"function", {{"name", "get_weather"},
                                           {"parameters", {{"type", "object"},
                                                           {"properties", {{"city", {{"type", "string"}, {"maxLength", 20}}}}},
                                                           {"required", {"city"}}}}}}}});
  json call = chat(json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}}), 200);
  call["tools"] = tools;
  call["tool_choice"] = "required";
  const json r = server.post("/v1/chat/completions", call);
  ASSERT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r;
  const json& calls = r["choices"][0]["message"]["tool_calls"];
  ASSERT_GE(calls.size(), 1u) << r;
  for (const json& c : calls) {
    EXPECT_EQ(c["function"]["name"], "get_weather") << r;
    const json args = json::parse(c["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args["city"].is_string()) << args;
  }

  body["response_format"]["json_schema"]["schema"]["properties"]["name"]["format"] = "email";
  const json refused = server.post("/v1/chat/completions", body, 400);
  EXPECT_NE(refused["error"]["message"].get<std::string>().find("format"), std::string::npos) << refused;
}

// Servers share a store directory: a second one on it starts and serves (the store is made for
// several engines: kv/persistent_store.h).
TEST(Server, TwoServersShareAStore) {
  test::TempDir dir("server_store_shared");
  ServerOptions options;
  options.cache.store_dir = dir.string();
  Running first(options);
  Running second(options);
  for (const Running* server : {&first, &second})
    EXPECT_EQ(server->post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", "Once"}, {"max_tokens", 2}})["object"],
              "text_completion");
}

// A port a server listens on is refused to a second one, with the address named (cpp-httplib's
// default SO_REUSEPORT let both bind, and clients were split between them).
TEST(Server, ASecondServerOnTheSamePortIsRefused) {
  Running first(ServerOptions{});
  ServerOptions options;
  options.model_dir = test::fixture_dir("v41-tiny");
  options.device = test::test_device();
  options.ranks = test::test_ranks();
  options.host = "127.0.0.1";
  options.port = first.port();
  Server second(options);
  try {
    second.run();
    ADD_FAILURE() << "a second server listened on port " << first.port();
  } catch (const dsv41::Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port()) + " (in use"), std::string::npos) << e.what();
  }
  EXPECT_EQ(first.post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", "Once"}, {"max_tokens", 2}})["object"], "text_completion");
}

// Stopping the server finishes the requests in flight (a stream gets its end) instead of
// waiting for them to run out.
TEST(Server, StopFinishesRequestsInFlight) {
  std::string wire;
  std::thread client;
  {
    Running server(ServerOptions{});
    std::promise<void> first_chunk;
    client = std::thread([&, port = server.port()] {
      httplib::Client c("127.0.0.1", port);
      c.set_read_timeout(120, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = json{{"model", "v41-tiny"}, {"prompt", "Once"}, {"max_tokens", 3000}, {"stream", true}, {"ignore_eos", true}}.dump();
      req.set_header("Content-Type", "application/json");
      bool told = false;
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        wire.append(data, n);
        if (!told) first_chunk.set_value(), told = true;
        return true;
      };
      c.send(req);
    });
    first_chunk.get_future().wait();
  }  // stops the server here, with the request running
  client.join();
  ASSERT_GE(wire.size(), 14u);
  EXPECT_EQ(wire.substr(wire.size() - 14), "data: [DONE]\n\n");
  EXPECT_LT(std::count(wire.begin(), wire.end(), '\n'), 2 * 3000) << "ran to the end instead of stopping";
}

// SSE framing as curl sees it on the wire: every event one "data: <json>" line and a blank line,
// the chunks of one stream under one id, the usage chunk last, then "data: [DONE]".
TEST(Server, SseFramingWithCurl) {
  Running server(ServerOptions{});
  json body = chat(json::array({{{"role", "user"}, {"content", "Hi"}}}), 5);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  FILE* pipe = popen(("curl -sN http://127.0.0.1:" + std::to_string(server.port()) +
                      "/v1/chat/completions -H 'Content-Type: application/json' -d '" + body.dump() + "'")
                         .c_str(),
                     "r");
  std::string wire;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) wire.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0);
  ASSERT_GE(wire.size(), 14u);
  EXPECT_EQ(wire.substr(wire.size() - 14), "data: [DONE]\n\n");
  std::vector<json> events;
  for (size_t at = 0; at < wire.size() - 14;) {
    const size_t end = wire.find("\n\n", at);
    ASSERT_NE(end, std::string::npos);
    if (wire.compare(at, 2, ": ") == 0) {  // a keep-alive comment, in a long silence
      at = end + 2;
      continue;
    }
    ASSERT_EQ(wire.compare(at, 6, "data: "), 0) << wire.substr(at, 40);
    events.push_back(json::parse(wire.substr(at + 6, end - at - 6)));
    at = end + 2;
  }
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.front()["choices"][0]["delta"]["role"], "assistant");
  for (const json& e : events) EXPECT_EQ(e["id"], events.front()["id"]);
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 5);
  EXPECT_EQ(events[events.size() - 2]["choices"][0]["finish_reason"], "length");
}

// A long prefill is a long silence: the stream says ": keep-alive" meanwhile (so that a client that
// hung up is noticed), and its events are framed as ever. 3500 prompt tokens take seconds on the
// CPU, milliseconds on the GPU: the heartbeat is set to 1 ms, shorter than either.
TEST(Server, KeepAliveDuringALongPrefill) {
  ServerOptions options;
  options.heartbeat_ms = 1;
  Running server(options);
  std::vector<int> prompt(3500);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = 3 + int(i * 7919 % 400);
  const json body = {{"model", "v41-tiny"}, {"prompt", prompt}, {"max_tokens", 2}, {"stream", true}};
  auto r = server.client().Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const std::string& wire = r->body;
  const size_t first_data = wire.find("data: ");
  ASSERT_NE(first_data, std::string::npos);
  EXPECT_NE(wire.substr(0, first_data).find(": keep-alive\n\n"), std::string::npos) << wire.substr(0, 200);
  EXPECT_EQ(wire.substr(wire.size() - 14), "data: [DONE]\n\n");
}

// An engine failure before the first token answers with a status of 500 and an OpenAI error
// body, streamed or not — not 200 with the error inside (the status line waits for the first
// token, up to a heartbeat). The failure here: a KV budget of 1 KB, which no prompt fits, so the
// scheduler refuses every request at admission.
TEST(Server, AnEngineFailureBeforeTheFirstTokenIs500) {
  ServerOptions options;
  options.kv_budget_gb = 1e-6;
  Running server(options);
  for (bool stream : {false, true}) {
    const json body = {{"model", "v41-tiny"}, {"prompt", "Hello"}, {"max_tokens", 2}, {"stream", stream}};
    auto r = server.client().Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500) << (stream ? "stream: " : "") << r->body;
    const json e = json::parse(r->body);
    EXPECT_EQ(e["error"]["type"], "server_error") << r->body;
    EXPECT_NE(e["error"]["message"].get<std::string>().find("KV budget"), std::string::npos) << r->body;
  }
}

// An engine failure after the reply has begun: a plain response still answers 500 with the error
// object (its status goes out with the whole reply), where it used to answer 200 with the error as
// its body, once a heartbeat of silence had sent the status line; a stream, whose status went out
// with its first event, ends with the error event and [DONE]. The failure: a KV budget that holds
// the prompt and 8 more tokens, so the sequence fails when it outgrows it, tokens into its reply.
TEST(Server, AnEngineFailureAfterTheFirstTokenIs500ForAPlainResponse) {
  const Accounting::Kv kv = account(load_config(test::fixture_dir("v41-tiny") + "/config.json"), 1).kv;
  const std::vector<int> prompt = {3, 4, 5, 6, 7};
  ServerOptions options;
  options.heartbeat_ms = 1;
  options.kv_budget_gb = double(kv.swa_bytes_per_sequence + kv.global_bytes_per_token * double(prompt.size() + 8)) / 1e9;
  Running server(options);
  const json plain = {{"model", "v41-tiny"}, {"prompt", prompt}, {"max_tokens", 200}, {"temperature", 0}};
  auto r = server.client().Post("/v1/completions", plain.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500) << r->body;
  const json e = json::parse(r->body);
  EXPECT_EQ(e["error"]["type"], "server_error") << r->body;
  EXPECT_NE(e["error"]["message"].get<std::string>().find("is full with this sequence alone"), std::string::npos) << r->body;

  json streamed = plain;
  streamed["stream"] = true;
  r = server.client().Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_NE(r->body.find("is full with this sequence alone"), std::string::npos) << r->body;
  EXPECT_EQ(r->body.substr(r->body.size() - 14), "data: [DONE]\n\n");
}

// A plain (non-streaming) request whose client hangs up is cancelled: nothing is written to it
// before the reply, so the server watches its socket for the end of the connection.
TEST(Server, APlainRequestWhoseClientLeavesIsCancelled) {
  Running server(ServerOptions{});
  const json body = {{"model", "v41-tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"ignore_eos", true}};
  const std::string text = body.dump();
  const int fd = connect_loopback(server.port());
  ASSERT_GE(fd, 0);
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                              std::to_string(text.size()) + "\r\n\r\n" + text;
  ASSERT_EQ(::write(fd, request.data(), request.size()), ssize_t(request.size()));
  for (int i = 0; i < 3000 && server.metric("dsv41_running_sequences") == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(server.metric("dsv41_running_sequences"), 1);
  ::close(fd);
  // As in AClientThatGoesAwayFreesItsSequence: up to 30 s on a loaded machine; a request never
  // cancelled still ends within it, and the cancel count catches it.
  for (int i = 0; i < 3000 && server.metric("dsv41_running_sequences") > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(server.metric("dsv41_running_sequences"), 0);
  EXPECT_EQ(server.metric("dsv41_requests_cancelled_total"), 1);
}

// /tokenize and /detokenize as vLLM has them: a text's ids are the tokenizer's (with or without
// the special tokens), a chat's are the prompt /v1/chat/completions runs (its usage says how
// many), and the ids of a text decode back to it; bad ids, a missing field and another model are
// refused with the field named.
TEST(Server, TokenizeAndDetokenize) {
  Running server(ServerOptions{});
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir("v41-tiny") + "/tokenizer.json");
  const std::string text = "Once upon a time, a tokenizer.";
  json r = server.post("/tokenize", {{"model", "v41-tiny"}, {"prompt", text}});
  EXPECT_EQ(r["tokens"].get<std::vector<int>>(), tokenizer.encode(text));
  EXPECT_EQ(r["count"], r["tokens"].size());
  EXPECT_EQ(r["max_model_len"], load_config(test::fixture_dir("v41-tiny") + "/config.json").max_seq_len);
  const std::vector<int> plain = tokenizer.encode(text, false);
  r = server.post("/tokenize", {{"model", "v41-tiny"}, {"prompt", text}, {"add_special_tokens", false}});
  EXPECT_EQ(r["tokens"].get<std::vector<int>>(), plain);
  EXPECT_EQ(server.post("/detokenize", {{"model", "v41-tiny"}, {"tokens", plain}})["prompt"], text);

  const json messages = json::array({{{"role", "user"}, {"content", "Say something."}}});
  const json chat_request = chat(messages, 1);
  const int64_t chat_tokens = server.post("/tokenize", chat_request)["count"];
  EXPECT_EQ(server.post("/v1/chat/completions", chat_request)["usage"]["prompt_tokens"], chat_tokens);

  r = server.post("/detokenize", {{"model", "v41-tiny"}, {"tokens", {1, 1 << 30}}}, 400);
  EXPECT_EQ(r["error"]["param"], "tokens[1]") << r;
  r = server.post("/tokenize", {{"model", "v41-tiny"}}, 400);
  EXPECT_EQ(r["error"]["param"], "prompt") << r;
  r = server.post("/tokenize", {{"model", "another"}, {"prompt", text}}, 404);
  EXPECT_EQ(r["error"]["code"], "model_not_found") << r;
}

// The access log: a line per request once its response is written, a stream's included, with the
// tokens and times the response itself reports; text or JSON.
TEST(Server, AccessLogHasALinePerRequest) {
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mutex = std::make_shared<std::mutex>();
  ServerOptions o;
  o.log_format = LogFormat::Json;
  o.access_log = [lines, mutex](const std::string& line) {
    std::lock_guard hold(*mutex);
    lines->push_back(line);
  };
  {
    Running server(o);
    // The line of the last request to `path`: the logger runs after the response's last byte has
    // gone, so it is waited for (and a start-up health poll's late line is passed over).
    auto last = [&](const std::string& path) {
      for (int i = 0; i < 400; ++i) {
        {
          std::lock_guard hold(*mutex);
          for (auto it = lines->rbegin(); it != lines->rend(); ++it) {
            json j = json::parse(*it);
            if (j["path"] != path) continue;
            lines->clear();
            return j;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ADD_FAILURE() << "no access line for " << path;
      return json::object();
    };
    const json messages = json::array({{{"role", "user"}, {"content", "Say something."}}});
    const json reply = server.post("/v1/chat/completions", chat(messages, 4));
    json e = last("/v1/chat/completions");
    EXPECT_EQ(e["method"], "POST");
    EXPECT_EQ(e["path"], "/v1/chat/completions");
    EXPECT_EQ(e["status"], 200);
    EXPECT_EQ(e["remote"], "127.0.0.1");
    EXPECT_EQ(e["prompt_tokens"], reply["usage"]["prompt_tokens"]);
    EXPECT_EQ(e["output_tokens"], reply["usage"]["completion_tokens"]);
    EXPECT_EQ(e["cached_tokens"], 0);
    EXPECT_GT(e["ttft_ms"].get<double>(), 0);
    EXPECT_GE(e["duration_ms"].get<double>(), e["ttft_ms"].get<double>());
    EXPECT_EQ(e["time"].get<std::string>().back(), 'Z');
    // The time before the engine is counted too: parsing (> 0) and the wait for admission.
    EXPECT_GT(server.metric("dsv41_request_parse_seconds_total"), 0);
    EXPECT_GE(server.metric("dsv41_queue_wait_seconds_total"), 0);
    EXPECT_LT(server.metric("dsv41_request_parse_seconds_total"), e["duration_ms"].get<double>() / 1e3);

    // A stream: logged when it ends, its tokens counted.
    auto r = server.client().Post("/v1/completions",
                                  json{{"model", "v41-tiny"}, {"prompt", "Once upon"}, {"max_tokens", 3}, {"stream", true},
                                       {"temperature", 0}, {"ignore_eos", true}}.dump(),
                                  "application/json");
    ASSERT_TRUE(r);
    e = last("/v1/completions");
    EXPECT_EQ(e["path"], "/v1/completions");
    EXPECT_EQ(e["output_tokens"], 3);

    // A refused request and a plain route: status, no token fields.
    server.post("/v1/completions", json{{"model", "v41-tiny"}, {"prompt", "x"}, {"temperature", 9}}, 400);
    e = last("/v1/completions");
    EXPECT_EQ(e["status"], 400);
    EXPECT_FALSE(e.contains("prompt_tokens"));
    ASSERT_TRUE(server.client().Get("/health"));
    e = last("/health");
    EXPECT_EQ(e["method"], "GET");
    EXPECT_EQ(e["path"], "/health");
    EXPECT_EQ(e["status"], 200);
  }
  AccessEntry text{"POST", "/v1/completions", "10.0.0.1", 200, 12, 8, 3, 41.26, 120.0, 1764842340123};
  EXPECT_EQ(access_line(LogFormat::Text, text),
            "2025-12-04T09:59:00.123Z 10.0.0.1 POST /v1/completions 200 prompt=12 cached=8 output=3 ttft=41.3ms 120.0ms");
  EXPECT_EQ(access_line(LogFormat::Off, text), "");
}

// logit_bias and the penalties reach the sampler (tests/sampling_test.cpp holds their arithmetic):
// +100 on a token makes every greedy token that one; −100 on the plain reply's first token moves
// it; out-of-range values are refused by name.
TEST(Server, LogitBiasAndPenaltiesReachTheSampler) {
  Running server(ServerOptions{});
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir("v41-tiny") + "/tokenizer.json");
  const int x = tokenizer.encode(" time", false).front();
  const json base = {{"model", "v41-tiny"}, {"prompt", "Once upon a"}, {"max_tokens", 5}, {"temperature", 0}, {"ignore_eos", true},
                     {"logprobs", 1}};
  json biased = base;
  biased["logit_bias"] = {{std::to_string(x), 100}};
  biased["presence_penalty"] = 0.5;
  biased["frequency_penalty"] = 0.25;
  biased["repetition_penalty"] = 1.5;
  json r = server.post("/v1/completions", biased);
  EXPECT_EQ(r["choices"][0]["text"], tokenizer.decode(std::vector<int>(5, x))) << r;

  const json plain = server.post("/v1/completions", base);
  const std::string first = plain["choices"][0]["logprobs"]["tokens"][0];
  const int y = tokenizer.encode(first, false).front();
  json banned = base;
  banned["logit_bias"] = {{std::to_string(y), -100}};
  r = server.post("/v1/completions", banned);
  EXPECT_NE(r["choices"][0]["logprobs"]["tokens"][0], first) << r;

  json bad = base;
  bad["logit_bias"] = {{"99999999", 1}};
  EXPECT_EQ(server.post("/v1/completions", bad, 400)["error"]["param"], "logit_bias");
  bad = base;
  bad["presence_penalty"] = 3;
  EXPECT_EQ(server.post("/v1/completions", bad, 400)["error"]["param"], "presence_penalty");
}

// A greedy completion of 12 tokens on v41-tiny, and what a server without speculation answers.
const json kGreedyRequest = {{"model", "v41-tiny"}, {"prompt", "Once upon a"}, {"max_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
std::string plain_reply() {
  Running server(ServerOptions{});
  return server.post("/v1/completions", kGreedyRequest)["choices"][0]["text"];
}

// Profiles under which drafting is next to free (a pass 10 ms at any row count, a draft a
// billionth of it), so that a speculating server drafts.
ServerOptions with_free_drafts(ServerOptions o) {
  o.scheduler.step_rate = o.scheduler.plain_rate = StepRate({{1, 100.0}, {1024, 100.0}});
  o.scheduler.draft_rate = StepRate({{1, 1e11}});
  return o;
}

// Speculative decoding in /metrics (serve --speculative dspark; fixture v41-tiny has a DSpark
// stage, γ = 4): a greedy reply's steps drafted γ tokens each, of which the prefix scheduler sent
// at most all and the target accepted at most those; the per-position counts add up to the
// accepted, and the time splits into drafting and verifying; the steps that decoded plainly instead
// are counted apart; the reply is plain greedy's. The profiles are given (rows and drafts next to
// free), so that the first step drafts on the prior whatever this machine's speed.
TEST(Server, SpeculativeDecodingIsInTheMetrics) {
  const std::string plain = plain_reply();
  ServerOptions o;
  o.scheduler.speculative = true;
  Running server(with_free_drafts(o));
  EXPECT_EQ(server.post("/v1/completions", kGreedyRequest)["choices"][0]["text"], plain);
  const double steps = server.metric("dsv41_spec_steps_total"), drafted = server.metric("dsv41_spec_draft_tokens_total"),
               verified = server.metric("dsv41_spec_verified_tokens_total"), accepted = server.metric("dsv41_spec_accepted_tokens_total");
  EXPECT_GT(steps, 0);
  EXPECT_EQ(drafted, 4 * steps);
  EXPECT_LE(verified, drafted);
  EXPECT_LE(accepted, verified);
  double at = 0;
  for (int k = 1; k <= 4; ++k) at += server.metric("dsv41_spec_accepted_at_position_total{position=\"" + std::to_string(k) + "\"}");
  EXPECT_EQ(at, accepted);
  EXPECT_GE(server.metric("dsv41_spec_passes_total"), steps);  // one sequence: a pass (and maybe a redo) per step
  const double draft = server.metric("dsv41_spec_draft_seconds_total"), verify = server.metric("dsv41_spec_verify_seconds_total");
  EXPECT_GT(draft, 0);
  EXPECT_GT(verify, 0);
  EXPECT_NEAR(server.metric("dsv41_spec_seconds_total"), draft + verify, 1e-6 * (draft + verify));
  EXPECT_NEAR(server.metric("dsv41_spec_mean_accepted"), accepted / steps, 1e-6);
  // 11 tokens after the first, a step each but for the accepted drafts (the last step's may run past the 12).
  const double plain_steps = server.metric("dsv41_spec_plain_steps_total");
  EXPECT_LE(steps + plain_steps, 11);
  EXPECT_GE(steps + plain_steps + accepted, 11);
}

// `--speculative auto` (the CLI's default): on v41-tiny, which has DSpark stages, the server
// speculates on CUDA and not on the CPU; either way the reply is plain greedy's.
TEST(Server, SpeculationByDefaultWhereTheModelRunsOnCuda) {
  const std::string plain = plain_reply();
  ServerOptions o;
  o.speculative_auto = true;
  Running server(with_free_drafts(o));
  EXPECT_EQ(server.post("/v1/completions", kGreedyRequest)["choices"][0]["text"], plain);
  // Every decode step of a speculating server is counted, drafted or plain; none where it does not speculate.
  const double counted = server.metric("dsv41_spec_steps_total") + server.metric("dsv41_spec_plain_steps_total");
  if (test::test_device() == Device::Cuda) EXPECT_GT(counted, 0);
  else EXPECT_EQ(counted, 0);
}

// Completions with "echo": the text is the prompt's, then the reply's, plain or streamed, for a
// text prompt and for token ids (decoded).
TEST(Server, CompletionsEchoThePrompt) {
  Running server(ServerOptions{});
  const json base = {{"model", "v41-tiny"}, {"prompt", "Once upon a"}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}};
  const std::string reply = server.post("/v1/completions", base)["choices"][0]["text"];
  json echo = base;
  echo["echo"] = true;
  const json r = server.post("/v1/completions", echo);
  EXPECT_EQ(r["choices"][0]["text"], "Once upon a" + reply) << r;
  EXPECT_EQ(r["usage"]["completion_tokens"], 4);
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir("v41-tiny") + "/tokenizer.json");
  echo["prompt"] = tokenizer.encode("Once upon a", false);
  EXPECT_EQ(server.post("/v1/completions", echo)["choices"][0]["text"], "Once upon a" + reply);
  echo["prompt"] = "Once upon a";
  echo["stream"] = true;
  auto s = server.client().Post("/v1/completions", echo.dump(), "application/json");
  ASSERT_TRUE(s);
  std::string text;
  std::istringstream in(s->body);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("data: {", 0) == 0) text += json::parse(line.substr(6))["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, "Once upon a" + reply) << s->body;
}

// Echo with logprobs: the prompt's tokens come first in the logprobs, the first unscored (null),
// the others scored by the rows before them — checked against DeepSeek's reference, the fixture's
// recorded logits of every row of prompt0's prefill (tolerance as in SchedulerTest.
// PromptLogprobsAreTheReferencesLogSoftmax: the forward holds these logits to 1e-5 on either
// executor, a log-softmax moves by at most twice that, plus fp32 rounding: 5e-5). The text_offsets
// count the listed tokens' code points; a stream sends the prompt's part with the echo, then the
// same entries as the plain response; every one of n choices starts with them.
TEST(Server, EchoWithLogprobsScoresThePrompt) {
  Running server(ServerOptions{});
  const test::Expected ex("v41-tiny");
  const std::vector<int64_t> ids = ex.ints("prompt0.tokens");
  const std::vector<float> reference = ex.floats("prompt0.prefill.logits");
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir("v41-tiny") + "/tokenizer.json");
  const std::unique_ptr<Model> model = Model::load(test::fixture_dir("v41-tiny"));
  const int64_t V = model->config().vocab_size, vocab = std::min<int64_t>(V, tokenizer.vocab_size());
  const json request = {{"model", "v41-tiny"}, {"prompt", ids}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true},
                        {"echo", true}, {"logprobs", 2}, {"n", 2}};
  const json r = server.post("/v1/completions", request);
  EXPECT_EQ(r["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 2 * 3);
  ASSERT_EQ(r["choices"].size(), 2u) << r;
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 3) << r;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null()) << lp;
  EXPECT_TRUE(lp["top_logprobs"][0].is_null()) << lp;
  int64_t offset = 0;
  for (size_t p = 0; p < ids.size() + 3; ++p) {
    if (p < ids.size()) {
      EXPECT_EQ(lp["tokens"][p], tokenizer.decode(std::vector<int>{int(ids[p])})) << p;
    }
    EXPECT_EQ(lp["text_offset"][p], offset) << p;
    offset += code_points(lp["tokens"][p].get<std::string>());
    if (p == 0) continue;
    EXPECT_EQ(lp["top_logprobs"][p].size(), 2u) << p;
    if (p >= ids.size()) continue;
    const float* row = reference.data() + (p - 1) * size_t(V);
    double top = *std::max_element(row, row + vocab), sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(row[i]) - top);
    EXPECT_NEAR(lp["token_logprobs"][p].get<double>(), double(row[ids[p]]) - top - std::log(sum), 5e-5) << "position " << p;
  }
  EXPECT_EQ(r["choices"][1]["logprobs"], lp);  // greedy: the same reply too
  const std::string text = r["choices"][0]["text"];
  EXPECT_EQ(text.rfind(tokenizer.decode(std::vector<int>(ids.begin(), ids.end())), 0), 0u) << text;

  json streamed = request;
  streamed["stream"] = true;
  streamed["n"] = 1;
  auto s = server.client().Post("/v1/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(s);
  json tokens = json::array(), offsets = json::array();
  std::string streamed_text;
  bool first = true;
  std::istringstream in(s->body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("data: {", 0) != 0) continue;
    const json c = json::parse(line.substr(6))["choices"][0];
    streamed_text += c["text"].get<std::string>();
    if (c["logprobs"].is_null()) continue;
    if (first) {
      EXPECT_EQ(c["logprobs"]["tokens"].size(), ids.size()) << "the echo's chunk: " << c;
    }
    first = false;
    for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& o : c["logprobs"]["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, lp["tokens"]) << s->body;
  EXPECT_EQ(offsets, lp["text_offset"]) << s->body;
  EXPECT_EQ(streamed_text, text);
}

// Thinking on with a max_tokens the reasoning uses up: no answer, and the response says so
// ("reasoning_only"). (The fixture's tokenizer spells "</think>" in several tokens: 3 greedy
// tokens cannot end the reasoning and give an answer too.)
TEST(Server, AReplyThatEndsInItsReasoningIsFlagged) {
  Running server(ServerOptions{});
  json request = chat(json::array({{{"role", "user"}, {"content", "Think first."}}}), 3);
  request["chat_template_kwargs"] = {{"thinking", true}};
  const json r = server.post("/v1/chat/completions", request);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << r;
  EXPECT_EQ(r["choices"][0]["message"]["content"], "") << r;
  EXPECT_FALSE(r["choices"][0]["message"]["reasoning_content"].get<std::string>().empty()) << r;
  EXPECT_EQ(r["choices"][0]["reasoning_only"], true) << r;
  request["chat_template_kwargs"] = {{"thinking", false}};
  EXPECT_FALSE(server.post("/v1/chat/completions", request)["choices"][0].contains("reasoning_only"));
}

// `serve --thinking off` (ServerOptions::thinking): a request that does not say is rendered
// without the reasoning section, so the same reply that was all reasoning above is the answer;
// a request's chat_template_kwargs still turn it on.
TEST(Server, ThinkingOffByDefaultAnswersInContent) {
  ServerOptions options;
  options.thinking = false;
  Running server(options);
  json request = chat(json::array({{{"role", "user"}, {"content", "Think first."}}}), 3);
  request.erase("chat_template_kwargs");
  const json off = server.post("/v1/chat/completions", request);
  EXPECT_FALSE(off["choices"][0]["message"]["content"].get<std::string>().empty()) << off;
  EXPECT_FALSE(off["choices"][0]["message"].contains("reasoning_content")) << off;
  EXPECT_FALSE(off["choices"][0].contains("reasoning_only")) << off;
  request["chat_template_kwargs"] = {{"thinking", true}};
  const json on = server.post("/v1/chat/completions", request);
  EXPECT_EQ(on["choices"][0]["reasoning_only"], true) << on;
  EXPECT_GT(on["usage"]["prompt_tokens"].get<int>(), off["usage"]["prompt_tokens"].get<int>()) << "the reasoning section's prompt";
}

// The official openai npm client (tests/e2e, installed by scripts/setup-e2e.sh) against the
// server: chat, streaming chat, completions, several choices (n), error cases and the SSE framing
// byte by byte.
TEST(Server, OpenAiClientScripts) {
  Running server(ServerOptions{});
  for (const char* script : {"chat", "stream", "completions", "choices", "errors", "sse"}) {
    const std::string cmd = "node " + (std::filesystem::path(DSV41_SOURCE_DIR) / "tests/e2e" / script).string() +
                            ".mjs --base-url http://127.0.0.1:" + std::to_string(server.port()) + " --model v41-tiny > /dev/null";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << script;
  }
}

// Bounded load on loopback: 64 concurrent clients x 8 requests (each client's later requests wait
// behind the 16 running and the full queue), no errors, memory bounded (the script samples the
// server's resident memory; numbers in docs/benchmarks.md). 8, not load.mjs's 20: CI's two cores
// took ~4 minutes for 1,280 requests.
TEST(Server, LoadTest) {
  ServerOptions options;
  options.scheduler.max_running = 16;
  options.scheduler.max_queued = 64;
  Running server(options);
  test::TempDir dir("load");  // the script's report, out of whatever directory the test runs in
  std::filesystem::create_directories(dir.path());
  const std::string report = (dir / "load.json").string();
  const std::string cmd = std::string("node ") + DSV41_SOURCE_DIR + "/tests/e2e/load.mjs --base-url http://127.0.0.1:" +
                          std::to_string(server.port()) + " --model v41-tiny --clients 64 --requests 8 --max-tokens 4 --pid " +
                          std::to_string(::getpid()) + " > " + report;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  std::ifstream in(report);
  json j = json::parse(in);
  std::printf("load: %s\n", j.dump().c_str());
  EXPECT_EQ(j["errors"], 0);
}

// 10,000 mutations of valid requests over HTTP (bytes flipped, inserted, deleted, spliced between
// bodies; seeded, so a failure replays), from 8 clients at once: every one gets an answer — 200,
// or a 4xx whose body is an OpenAI error object, or 503 while the queue is full — and never another
// 5xx or a dropped connection, and the server serves a valid request at the end. A mutated request whose reply runs long (a max_tokens
// grown to thousands) is cut by its client after 0.15 s, a cancellation the server must survive too (at 0.5 s the clients'
// waits for ~900 such replies were 57 of the test's 61 s on a 2-core box; now ~400 are cut and it takes 23 s). The in-process
// fuzz targets (fuzz/) cover the parsers more deeply; this covers the server's whole path under such input.
TEST(Server, SurvivesTenThousandMutatedRequests) {
  Running server(ServerOptions{});
  const std::vector<std::pair<std::string, std::string>> seeds = {
      {"/v1/completions", R"({"model":"v41-tiny","prompt":"Once upon","max_tokens":2})"},
      {"/v1/completions", R"({"model":"v41-tiny","prompt":[5,6,7],"max_tokens":1,"stream":true,"logprobs":2})"},
      {"/v1/chat/completions", R"({"model":"v41-tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":2})"},
      {"/v1/chat/completions",
       R"({"model":"v41-tiny","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Why?"}],)"
       R"("max_tokens":1,"stream":true,"stream_options":{"include_usage":true},"temperature":0.5,"seed":3,"stop":["\n"]})"},
  };
  std::atomic<int> next{0}, answered{0}, cut{0}, busy{0};
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  auto client = [&](int worker) {
    std::mt19937_64 rng(uint64_t(worker) * 7919 + 1);
    httplib::Client c("127.0.0.1", server.port());
    c.set_read_timeout(0, 150'000);
    for (int i; (i = next.fetch_add(1)) < 10000;) {
      const auto& [path, seed] = seeds[rng() % seeds.size()];
      std::string body = seed;
      for (int m = 0, n = 1 + int(rng() % 4); m < n && !body.empty(); ++m) {
        const size_t at = rng() % body.size();
        switch (rng() % 4) {
          case 0: body[at] = char(rng() % 256); break;
          case 1: body.insert(at, 1, "{}[]\",:0-9e\\u"[rng() % 14]); break;
          case 2: body.erase(at, 1 + rng() % 8); break;
          default: body = body.substr(0, at) + seeds[rng() % seeds.size()].second.substr(at % 20); break;
        }
      }
      auto r = c.Post(path, body, "application/json");
      if (!r && r.error() == httplib::Error::Read) {  // a long reply cut by the client
        cut += 1;
        continue;
      }
      std::string problem;
      if (!r) problem = "no answer: " + httplib::to_string(r.error());
      // 503: every queue slot is held by replies the clients cut, refused as documented.
      else if (r->status >= 500 && r->status != 503) problem = "status " + std::to_string(r->status);
      else if (r->status != 200) {
        busy += r->status == 503;
        const json e = json::parse(r->body, nullptr, false);
        if (!e.is_object() || !e.contains("error") || !e["error"].contains("message")) problem = "status " + std::to_string(r->status) + " without an error object";
      }
      answered += 1;
      if (!problem.empty()) {
        std::lock_guard lock(failures_mutex);
        if (failures.size() < 5) failures.push_back(problem + " for " + path + " " + body);
      }
    }
  };
  std::vector<std::thread> clients;
  for (int w = 0; w < 8; ++w) clients.emplace_back(client, w);
  for (std::thread& t : clients) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " bad answers, e.g. " << failures.front();
  // How many replies the client's timeout cuts (long generations) and how many the full queue
  // refuses depends on the machine's speed, so they are reported, not bounded.
  std::printf("%d answered (%d refused as busy), %d cut by the client\n", answered.load(), busy.load(), cut.load());
  // The next valid request is served, once the queue has drained the cut replies (a busy
  // server says 503 with Retry-After: 1 until then).
  const std::string valid = json{{"model", "v41-tiny"}, {"prompt", "Once"}, {"max_tokens", 2}, {"ignore_eos", true}}.dump();
  httplib::Client c = server.client();
  auto r = c.Post("/v1/completions", valid, "application/json");
  for (int retry = 0; r && r->status == 503 && retry < 120; ++retry) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    r = c.Post("/v1/completions", valid, "application/json");
  }
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 2);
}

#if defined(__SANITIZE_ADDRESS__)
// The sanitizer runtime's (GCC ships no header declaring it): its quarantine and caches drained.
extern "C" void __sanitizer_purge_allocator();
#endif

// The resident memory of this process, from /proc (kB → bytes). Under AddressSanitizer
// (scripts/sanitize.sh) its quarantine is drained first: freed blocks it holds back on purpose,
// to catch uses after free, are the sanitizer's memory, not the server's.
int64_t resident_bytes() {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_purge_allocator();
#endif
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

// 50 bodies of 10 MB that are not JSON, from 8 clients: each gets its 400, and the memory they
// took is given back (the server and this test share a process: its RSS grows by less than
// 100 MB; it grew by ~390 MB when freed bodies stayed in malloc's arenas).
TEST(Server, LargeRejectedBodiesGiveTheirMemoryBack) {
  Running server(ServerOptions{});
  const std::string body(10 << 20, 'a');
  server.post("/v1/completions", {{"model", "v41-tiny"}, {"prompt", "Once"}, {"max_tokens", 1}});  // warm
  const int64_t before = resident_bytes();
  std::atomic<int> next{0}, bad{0};
  std::vector<std::thread> clients;
  for (int w = 0; w < 8; ++w)
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", server.port());
      for (int i; (i = next.fetch_add(1)) < 50;) {
        auto r = c.Post("/v1/completions", body, "application/json");
        if (!r || r->status != 400) bad += 1;
      }
    });
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(bad.load(), 0);
  const int64_t grown = resident_bytes() - before;
  std::printf("RSS grew by %.1f MB\n", double(grown) / 1e6);
  EXPECT_LT(grown, int64_t(100) << 20);
}

// The listener holds a burst of connections: its backlog (the kernel's, as TCP_INFO reports it
// for a listening socket) is 4,096 or the kernel's cap (net.core.somaxconn), not cpp-httplib's 5,
// which a burst of 64 clients overflowed (each burst: dozens of ListenOverflows, and connections
// completed by SYN cookies that the full queue dropped: the client's read error).
TEST(Server, TheListenerHoldsABurstOfConnections) {
  Running server(ServerOptions{});
  int cap = 4096;
  std::ifstream("/proc/sys/net/core/somaxconn") >> cap;
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::atoi(entry.path().filename().c_str());
    int listening = 0;
    socklen_t n = sizeof listening;
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &n) != 0 || !listening) continue;
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || addr.sin_family != AF_INET ||
        ntohs(addr.sin_port) != server.port())
      continue;
    tcp_info info{};
    socklen_t info_len = sizeof info;
    ASSERT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &info_len), 0);
    EXPECT_EQ(int(info.tcpi_sacked), std::min(4096, cap)) << "the listener's backlog";
    found += 1;
  }
  EXPECT_EQ(found, 1) << "listening sockets on port " << server.port();
}

// 150 slow clients, each sending a header line a second and never finishing its request, hold a
// handler thread each: /health still answers (within a client timeout of 1 s; measured: a few ms).
// With threads only for the requests the scheduler takes (80), they starved it for as long as
// they stayed.
TEST(Server, SlowClientsDoNotStarveHealth) {
  Running server(ServerOptions{});
  std::vector<int> slow;
  for (int i = 0; i < 150; ++i) {
    const int fd = connect_loopback(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_GT(::send(fd, "GET /health HTTP/1.1\r\n", 22, MSG_NOSIGNAL), 0);
    slow.push_back(fd);
  }
  httplib::Client c("127.0.0.1", server.port());
  c.set_connection_timeout(1, 0);
  c.set_read_timeout(1, 0);
  for (int round = 0; round < 3; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
    for (int fd : slow) ::send(fd, "X-Slow: 1\r\n", 11, MSG_NOSIGNAL);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = c.Get("/health");
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r) << "round " << round << ": " << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    std::printf("round %d: /health in %.1f ms beside %zu slow connections\n", round, ms, slow.size());
  }
  for (int fd : slow) ::close(fd);
}
