// The SWA pool's put and get (the get_first of one live candidate, as a turn's lookup) per tail,
// in this process against memcached servers on the loopback, started by the benchmark itself
// (one, and three with the tails' chunks spread over them). Tails of the sizes of bench-1gpu and of
// V4.1-Flash: every layer's SWA ring (accounting's swa_bytes_per_sequence), the bulk of a real tail.
//
//   cmake --build build --target swa_pool_bench && ./build/bench/swa_pool_bench
//
// Arguments: pool (0 in-process, 1 one memcached, 3 three), model (0 bench-1gpu, 1 V4.1-Flash).
// Counters: bytes_per_second of tail moved; the time is per operation (a put: until flush() returns,
// the tail on the servers).
#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <vector>

#include "../tests/memcached_process.h"
#include "kv/memcached_swa_pool.h"
#include "model/accounting.h"
#include "model/config.h"

using namespace dsv41;

namespace {

int64_t tail_bytes(int model) {
  return account(preset(model == 0 ? "bench-1gpu" : "deepseek-v4.1-flash"), 1).kv.swa_bytes_per_sequence;
}

// A pool of the kind asked for, and the memcached servers behind it.
struct Pool {
  std::vector<std::unique_ptr<test::MemcachedProcess>> servers;
  std::unique_ptr<SwaTier> tier;
  explicit Pool(int kind) {
    SwaPoolOptions o;
    o.budget_bytes = int64_t(2) << 30;
    for (int i = 0; i < kind; ++i) servers.push_back(std::make_unique<test::MemcachedProcess>(1024));
    if (kind > 0) o.url = test::url_of(servers);
    tier = make_swa_tier(o);
  }
};

SwaSnapshot tail_of(int64_t bytes) {
  std::mt19937 rng(7);
  SwaSnapshot s;
  s.tail.resize(size_t(bytes));
  for (uint8_t& b : s.tail) b = uint8_t(rng());
  return s;
}

void BM_SwaPut(benchmark::State& state) {
  Pool pool(int(state.range(0)));
  const SwaSnapshot tail = tail_of(tail_bytes(int(state.range(1))));
  uint64_t i = 0;
  for (auto _ : state) {
    state.PauseTiming();
    SwaSnapshot copy = tail;  // the engine moves in a tail it made; the copy is not the pool's cost
    state.ResumeTiming();
    if (!pool.tier->put(BlockKey{++i % 64, 1}, 1000, std::move(copy))) state.SkipWithError("put refused");
    pool.tier->flush();  // on the servers, where another engine finds it
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(tail.tail.size()));
  state.counters["tail_bytes"] = double(tail.tail.size());
}

void BM_SwaGet(benchmark::State& state) {
  Pool pool(int(state.range(0)));
  const SwaSnapshot tail = tail_of(tail_bytes(int(state.range(1))));
  for (uint64_t k = 0; k < 64; ++k) pool.tier->put(BlockKey{k, 1}, 1000, tail);
  pool.tier->flush();
  uint64_t i = 0;
  for (auto _ : state) {
    const std::pair<BlockKey, int64_t> c{BlockKey{++i % 64, 1}, 1000};
    if (!pool.tier->get_first(std::span(&c, 1))) state.SkipWithError("miss");
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(tail.tail.size()));
  state.counters["tail_bytes"] = double(tail.tail.size());
}

}  // namespace

BENCHMARK(BM_SwaPut)->ArgsProduct({{0, 1, 3}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_SwaGet)->ArgsProduct({{0, 1, 3}, {0, 1}})->Unit(benchmark::kMicrosecond)->UseRealTime();
