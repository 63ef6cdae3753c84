// The SWA pool on memcached (kv/memcached_swa_pool.h) against real memcached servers on the
// loopback, started and stopped by the tests: tails larger than an item round-trip across
// servers, the first live candidate wins, a torn or corrupted entry is a miss, the TTL runs from
// the last use, a server that dies gives misses and not errors, and an engine continues a
// conversation exactly from a tail that went through memcached.
#include <gtest/gtest.h>
#include <libmemcached/memcached.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <random>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "engine/session.h"
#include "fixture.h"
#include "kv/memcached_swa_pool.h"
#include "memcached_process.h"
#include "serve_process.h"
#include "test_util.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

SwaSnapshot random_tail(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  SwaSnapshot s;
  s.tail.resize(bytes);
  for (uint8_t& b : s.tail) b = uint8_t(rng());
  return s;
}

BlockKey key(uint64_t i) { return BlockKey{0x1234 + i, 0xabcd * (i + 1)}; }

struct MemcachedSwaPoolTest : ::testing::Test {
  std::vector<std::unique_ptr<MemcachedProcess>> servers;
  void start(int n) {
    for (int i = 0; i < n; ++i) {
      servers.push_back(std::make_unique<MemcachedProcess>());
      ASSERT_TRUE(servers.back()->error().empty()) << servers.back()->error();
    }
  }
  MemcachedSwaPoolOptions options(int64_t chunk_bytes = 1000 * 1000, int64_t ttl_ms = 60'000) const {
    MemcachedSwaPoolOptions o;
    o.servers = parse_memcached_url(url_of(servers));
    o.chunk_bytes = chunk_bytes;
    o.ttl_ms = ttl_ms;
    return o;
  }
  // A client of its own, to reach under the pool (tear entries).
  memcached_st* raw() {
    memcached_st* m = memcached_create(nullptr);
    for (const auto& s : servers) memcached_server_add(m, "127.0.0.1", in_port_t(s->port()));
    memcached_behavior_set(m, MEMCACHED_BEHAVIOR_DISTRIBUTION, MEMCACHED_DISTRIBUTION_CONSISTENT);
    return m;
  }
};

}  // namespace

TEST(MemcachedUrl, ServersAndRefusals) {
  const std::vector<MemcachedServer> s = parse_memcached_url("memcached://a.example:1,10.0.0.2,b:65535");
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].host, "a.example");
  EXPECT_EQ(s[0].port, 1);
  EXPECT_EQ(s[1].host, "10.0.0.2");
  EXPECT_EQ(s[1].port, 11211);
  EXPECT_EQ(s[2].port, 65535);
  for (const char* bad : {"http://a:1", "memcached://", "memcached://a:0", "memcached://a:65536", "memcached://a:x",
                          "memcached://a:1,", "memcached://:5"})
    EXPECT_THROW(parse_memcached_url(bad), Error) << bad;
}

// A V4.1-Flash-sized tail (2.8 MB) in chunks of at most an item, and a small one, over 3 servers.
TEST_F(MemcachedSwaPoolTest, TailsLargerThanAnItemRoundTrip) {
  start(3);
  MemcachedSwaPool pool(options());
  for (const size_t bytes : {size_t(2'800'000), size_t(1'000'000), size_t(1'000'001), size_t(1), size_t(5000)}) {
    const SwaSnapshot tail = random_tail(bytes, uint32_t(bytes));
    ASSERT_TRUE(pool.put(key(bytes), 77, tail)) << bytes;
    pool.flush();  // from memcached, not from the queue
    const std::pair<BlockKey, int64_t> c{key(bytes), 77};
    const std::optional<SwaTier::Found> found = pool.get_first(std::span(&c, 1));
    ASSERT_TRUE(found.has_value()) << bytes;
    EXPECT_EQ(found->snapshot->tail, tail.tail) << bytes;
  }
  const SwaPoolStats s = pool.stats();
  EXPECT_EQ(s.hits, 5);
  EXPECT_EQ(s.misses, 0);
  EXPECT_EQ(s.server_errors, 0);
  EXPECT_EQ(s.bytes_written, 4'805'002 + 5 * 56);  // the tails and their manifests
  EXPECT_EQ(s.bytes_read, 4'805'002 + 5 * 56);
}

TEST_F(MemcachedSwaPoolTest, TheFirstLiveCandidateWinsAndAPutReplaces) {
  start(2);
  MemcachedSwaPool pool(options(4096));
  ASSERT_TRUE(pool.put(key(1), 10, random_tail(10'000, 1)));
  ASSERT_TRUE(pool.put(key(2), 12, random_tail(10'000, 2)));
  pool.flush();
  const std::vector<std::pair<BlockKey, int64_t>> candidates = {{key(3), 13}, {key(2), 12}, {key(1), 10}};
  std::optional<SwaTier::Found> found = pool.get_first(candidates);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->index, 1u);
  EXPECT_EQ(found->snapshot->tail, random_tail(10'000, 2).tail);
  // The same key at another position is another entry; a put at the same one replaces it.
  const std::pair<BlockKey, int64_t> other{key(2), 11};
  EXPECT_FALSE(pool.get_first(std::span(&other, 1)).has_value());
  ASSERT_TRUE(pool.put(key(2), 12, random_tail(7'000, 9)));
  pool.flush();
  found = pool.get_first(candidates);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->snapshot->tail, random_tail(7'000, 9).tail);
  EXPECT_EQ(pool.stats().misses, 1);
}

// A put still queued is served from memory: an engine reads its own writes at once; the
// destructor writes what is queued.
TEST_F(MemcachedSwaPoolTest, QueuedPutsAreServedAndWrittenAtTheEnd) {
  start(2);
  {
    MemcachedSwaPool pool(options(50'000));
    for (int i = 0; i < 20; ++i) {
      ASSERT_TRUE(pool.put(key(uint64_t(500 + i)), 3, random_tail(200'000, uint32_t(i))));
      const std::pair<BlockKey, int64_t> c{key(uint64_t(500 + i)), 3};
      const std::optional<SwaTier::Found> found = pool.get_first(std::span(&c, 1));
      ASSERT_TRUE(found.has_value()) << i;
      EXPECT_EQ(found->snapshot->tail, random_tail(200'000, uint32_t(i)).tail);
    }
  }
  MemcachedSwaPool other(options(50'000));  // another engine on the same servers
  for (int i = 0; i < 20; ++i) {
    const std::pair<BlockKey, int64_t> c{key(uint64_t(500 + i)), 3};
    const std::optional<SwaTier::Found> found = other.get_first(std::span(&c, 1));
    ASSERT_TRUE(found.has_value()) << i;
    EXPECT_EQ(found->snapshot->tail, random_tail(200'000, uint32_t(i)).tail);
  }
  EXPECT_EQ(other.stats().bytes_read, 20 * (200'000 + 56));
}

// A chunk deleted, shortened or corrupted (the same length): the entry is a miss, counted as torn,
// and an older candidate behind it is still served.
TEST_F(MemcachedSwaPoolTest, ATornOrCorruptedEntryIsAMiss) {
  start(3);
  MemcachedSwaPool pool(options(10'000));
  memcached_st* m = raw();
  for (int kind = 0; kind < 3; ++kind) {
    const BlockKey k = key(100 + uint64_t(kind));
    ASSERT_TRUE(pool.put(k, 50, random_tail(35'000, 5)));
    ASSERT_TRUE(pool.put(k, 40, random_tail(35'000, 6)));
    pool.flush();
    // The manifest names the put's nonce (bytes 32..39, little-endian: docs/kv-tiers.md).
    const std::string manifest = MemcachedSwaPool::manifest_key(k, 50);
    size_t n = 0;
    uint32_t flags = 0;
    memcached_return_t rc;
    char* v = memcached_get(m, manifest.data(), manifest.size(), &n, &flags, &rc);
    ASSERT_NE(v, nullptr);
    ASSERT_EQ(n, 56u);
    uint64_t nonce = 0;
    for (int i = 0; i < 8; ++i) nonce |= uint64_t(uint8_t(v[32 + i])) << (8 * i);
    free(v);
    const std::string chunk = MemcachedSwaPool::chunk_key(manifest, nonce, 2);
    if (kind == 0) {
      ASSERT_EQ(memcached_delete(m, chunk.data(), chunk.size(), 0), MEMCACHED_SUCCESS);
    } else {
      std::string bytes(kind == 1 ? 9'999 : 10'000, '\x5a');
      ASSERT_EQ(memcached_set(m, chunk.data(), chunk.size(), bytes.data(), bytes.size(), 60, 0), MEMCACHED_SUCCESS);
    }
    const std::vector<std::pair<BlockKey, int64_t>> candidates = {{k, 50}, {k, 40}};
    const std::optional<SwaTier::Found> found = pool.get_first(candidates);
    ASSERT_TRUE(found.has_value()) << kind;
    EXPECT_EQ(found->index, 1u) << kind;
    EXPECT_EQ(found->snapshot->tail, random_tail(35'000, 6).tail) << kind;
    EXPECT_EQ(pool.stats().torn, kind + 1);
  }
  memcached_free(m);
}

// memcached's TTL, renewed by every hit: alive 3.6 s after the put because it was used at 1.8 s,
// gone 3.5 s after the last use. (memcached's clock ticks once a second: an item of TTL 3 s
// expires between 2 and 3 s after its last set or touch.)
TEST_F(MemcachedSwaPoolTest, TheTtlRunsFromTheLastUse) {
  start(1);
  MemcachedSwaPool pool(options(1000 * 1000, 3000));
  ASSERT_TRUE(pool.put(key(7), 5, random_tail(3000, 7)));
  pool.flush();
  const std::pair<BlockKey, int64_t> c{key(7), 5};
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  EXPECT_TRUE(pool.get_first(std::span(&c, 1)).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(1800));
  EXPECT_TRUE(pool.get_first(std::span(&c, 1)).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  EXPECT_FALSE(pool.get_first(std::span(&c, 1)).has_value());
}

// One of three servers killed mid-run: its entries miss, nothing throws, and later puts land on
// the servers left and are served.
TEST_F(MemcachedSwaPoolTest, ADeadServerGivesMissesNotErrors) {
  start(3);
  MemcachedSwaPool pool(options(20'000));
  constexpr int kEntries = 24;
  for (int i = 0; i < kEntries; ++i) ASSERT_TRUE(pool.put(key(uint64_t(i)), 64, random_tail(100'000, uint32_t(i))));
  pool.flush();
  servers[1]->kill();
  int hits = 0;
  for (int i = 0; i < kEntries; ++i) {
    const std::pair<BlockKey, int64_t> c{key(uint64_t(i)), 64};
    std::optional<SwaTier::Found> found;
    ASSERT_NO_THROW(found = pool.get_first(std::span(&c, 1)));
    if (found) {
      ++hits;
      EXPECT_EQ(found->snapshot->tail, random_tail(100'000, uint32_t(i)).tail);
    }
  }
  EXPECT_LT(hits, kEntries);  // 6 keys an entry over 3 servers: all but ~9% touch the dead one
  EXPECT_EQ(pool.stats().misses, kEntries - hits);
  for (int i = 0; i < 8; ++i) {
    const BlockKey k = key(uint64_t(1000 + i));
    pool.put(k, 64, random_tail(100'000, uint32_t(1000 + i)));
    pool.flush();
    const std::pair<BlockKey, int64_t> c{k, 64};
    std::optional<SwaTier::Found> found;
    ASSERT_NO_THROW(found = pool.get_first(std::span(&c, 1)));
    ASSERT_TRUE(found.has_value()) << i;
    EXPECT_EQ(found->snapshot->tail, random_tail(100'000, uint32_t(1000 + i)).tail);
  }
}

// The engine over a cache whose pool is memcached: a new session finds the end-of-output tail
// there and goes on bit for bit as the session that never stopped (as prefix_cache_test's
// SwaHitContinuesExactly with the in-process pool).
TEST_F(MemcachedSwaPoolTest, AnEngineContinuesExactlyFromMemcached) {
  start(2);
  std::unique_ptr<Model> model = Model::load(fixture_dir("v41-tiny"));
  const Tokenizer tokenizer = Tokenizer::from_file(fixture_dir("v41-tiny") + "/tokenizer.json");
  const std::vector<int64_t> t = Expected("v41-tiny").ints("prompt2.tokens");
  const std::vector<int> text(t.begin(), t.end());
  KvCacheOptions o;
  o.fingerprint = "v41-tiny fixture";
  o.mode = mode_name(Mode::Default);
  o.host_budget_bytes = 64 << 20;
  o.swa.url = url_of(servers);
  KvCache cache(model->config(), o);

  Session a(*model, &tokenizer, Mode::Default);
  std::vector<int> conversation(text.begin(), text.begin() + 150);
  std::vector<float> logits = a.prefill_prompt(conversation, &cache);
  for (int k = 0; k < 10; ++k) {
    conversation.push_back(int(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    logits = a.decode(conversation.back());
  }
  a.save(cache);
  cache.flush();  // the tail from memcached, not from the queue
  std::vector<int> prompt = conversation;
  prompt.insert(prompt.end(), text.begin() + 160, text.end());

  Session b(*model, &tokenizer, Mode::Default);
  PrefixUse use;
  const std::vector<float> restored = b.prefill_prompt(prompt, &cache, &use);
  EXPECT_EQ(use.swa_tokens, 160);
  EXPECT_EQ(use.replayed, 0);
  const std::vector<float> live = a.prefill(std::span(prompt).subspan(160));
  EXPECT_EQ(restored, live);
  EXPECT_GE(cache.stats().swa.hits, 1);
}

// Two engine processes behind a balancer share the tiers (issue 21's deployment): a store
// directory and three memcached servers. A conversation's second turn, on the engine that did not
// serve the first, continues exactly from the SWA pool (no replay); after the TTL, its third turn
// comes from the other engine's blocks in the shared store with a replay; with a memcached server
// killed, a fourth turn is still served.
TEST_F(MemcachedSwaPoolTest, TwoEngineProcessesShareTheTiers) {
  start(3);
  test::TempDir dir("two_engines");
  const std::string args = "--model " + fixture_dir("v41-tiny") + " --device cpu --store " + dir.string() +
                           " --swa-pool " + url_of(servers) + " --swa-ttl 3";
  test::ServeProcess a(args, ""), b(args, "");
  ASSERT_GT(a.port(), 0);
  ASSERT_GT(b.port(), 0);
  auto post = [](const test::ServeProcess& engine, const nlohmann::json& messages) {
    httplib::Client c("127.0.0.1", engine.port());
    c.set_read_timeout(120, 0);
    for (int i = 0; i < 2000 && !(c.Get("/health") && c.Get("/health")->status == 200); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const nlohmann::json body{{"model", "v41-tiny"}, {"messages", messages}, {"max_tokens", 8}, {"temperature", 0},
                              {"chat_template_kwargs", {{"thinking", false}}}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
    return r && r->status == 200 ? nlohmann::json::parse(r->body) : nlohmann::json{};
  };
  auto metric = [](const test::ServeProcess& engine, const std::string& line_start) {
    httplib::Client c("127.0.0.1", engine.port());
    auto r = c.Get("/metrics");
    std::istringstream in(r ? r->body : "");
    for (std::string line; std::getline(in, line);)
      if (line.rfind(line_start + " ", 0) == 0) return std::stod(line.substr(line_start.size() + 1));
    ADD_FAILURE() << "no metric " << line_start;
    return -1.0;
  };
  // A turn's KV reaches the shared tiers after its reply: the engine's writer threads store its
  // blocks and tails.
  auto settled = [&](const test::ServeProcess& engine) {
    for (int i = 0; i < 400 && (metric(engine, "dsv41_store_blocks") < 1 ||
                                metric(engine, "dsv41_swa_pool_traffic_bytes_total{direction=\"out\"}") <= 0);
         ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  };
  nlohmann::json messages = nlohmann::json::array(
      {{{"role", "system"}, {"content", "You answer questions about the sea, briefly and kindly, in whole sentences."}},
       {{"role", "user"}, {"content", "Why is the sea salty, and why does it not get saltier every year?"}}});
  nlohmann::json r = post(a, messages);
  messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
  settled(a);

  messages.push_back({{"role", "user"}, {"content", "And why is it blue?"}});
  r = post(b, messages);
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 64) << r;
  EXPECT_GT(metric(b, "dsv41_cache_hit_tokens_total{tier=\"swa_pool\"}"), 0);
  EXPECT_GT(metric(b, "dsv41_cache_hit_tokens_total{tier=\"disk\"}"), 0);
  EXPECT_EQ(metric(b, "dsv41_cache_replayed_tokens_total"), 0);
  messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});
  settled(b);

  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // past the TTL: the tails are gone
  messages.push_back({{"role", "user"}, {"content", "Thank you!"}});
  r = post(a, messages);
  EXPECT_GE(r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(), 64) << r;
  EXPECT_EQ(metric(a, "dsv41_cache_replayed_tokens_total"), 16);  // W of v41-tiny
  EXPECT_GT(metric(a, "dsv41_cache_hit_tokens_total{tier=\"disk\"}"), 0);  // b's blocks
  messages.push_back({{"role", "assistant"}, {"content", r["choices"][0]["message"]["content"]}});

  servers[0]->kill();
  messages.push_back({{"role", "user"}, {"content", "One more thing."}});
  r = post(b, messages);
  EXPECT_EQ(r["object"], "chat.completion") << r;
  EXPECT_EQ(a.stop().first, 0);
  EXPECT_EQ(b.stop().first, 0);
}
