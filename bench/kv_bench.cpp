// The KV tiers' host work around one agent turn on a long cached prefix, at bench-1gpu's shapes
// (V4.1-Flash's attention: the KV of a token in every layer), on one core:
//   BM_LookupSwaHit  what Session::plan does on an SWA-pool hit before handing the state to the
//                    executor: find_blocks over the prefix (host cache), find_tail, restore_sequence
//   BM_StoreTurn     what Session::save does after a turn of 80 new tokens: store_blocks (the new
//                    blocks only) and store_tail (the SWA snapshot at the end)
//   BM_LookupDiskHit what Session::plan does on a hit in the persistent store after a restart (the
//                    host cache and the SWA pool empty, the files in the OS page cache): find_blocks
//                    reads every block from disk, then restore_sequence (the tail is replayed)
//   BM_StorePrompt   a cold prompt's blocks into the host cache and a persistent store (a temporary
//                    directory): the time store_blocks holds the caller (the engine's loop), and
//                    the writer thread's time to have them on disk (flush), as "disk_ms"
// Argument: the prefix's tokens. The speed of light is the bytes moved (the prefix's global KV,
// ~890 B per token, and the windows) over the core's memory bandwidth; the figures name them.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/prefix_key.h"
#include "kv/sequence_blocks.h"
#include "model/config.h"
#include "numerics/codecs.h"

namespace {

using namespace dsv41;

// A state of `tokens` tokens with random cache bytes, as a forward would leave it.
SequenceState random_state(const Config& c, int64_t tokens, uint32_t seed) {
  SequenceState s(c);
  std::mt19937 rng(seed);
  auto fill = [&](std::vector<uint8_t>& v) {
    for (uint8_t& b : v) b = uint8_t(rng());
  };
  for (auto& ring : s.window) fill(ring);
  for (auto& [layer, cache] : s.compressed) {
    const int ratio = c.compress_ratios[size_t(layer)];
    cache.entries = tokens / ratio;
    cache.kv.resize(size_t(cache.entries) * kv_fp4::bytes(c.head_dim));
    cache.index_k.resize(size_t(cache.entries) * mxfp4::bytes(c.index_head_dim));
    fill(cache.kv), fill(cache.index_k);
    cache.pending = int(tokens % ratio);
    if (ratio > 1) cache.pending_kv.assign(size_t(ratio) * c.head_dim, 0.5f), cache.pending_score.assign(size_t(ratio) * c.head_dim, 0.25f);
  }
  s.length = tokens;
  return s;
}

std::vector<int> random_tokens(int64_t n, uint32_t seed) {
  std::vector<int> t(static_cast<size_t>(n));
  std::mt19937 rng(seed);
  for (int& v : t) v = 3 + int(rng() % 100000);
  return t;
}

KvCacheOptions options() {
  KvCacheOptions o;
  o.fingerprint = "kv_bench";
  o.mode = "default";
  return o;
}

void BM_LookupSwaHit(benchmark::State& state) {
  const Config c = preset("bench-1gpu");
  const int64_t n = state.range(0);
  KvCache cache(c, options());
  const std::vector<int> tokens = random_tokens(n + 80, 1);
  const SequenceState s = random_state(c, n, 2);
  cache.store_blocks(std::span(tokens).first(size_t(n)), view_of(s), 0);
  cache.store_tail(std::span(tokens).first(size_t(n)), view_of(s));
  const int B = cache.block_tokens();
  const int64_t P = int64_t(tokens.size());
  for (auto _ : state) {
    BlockRun run = cache.find_blocks(tokens, (P - 1) / B);
    const int64_t H = run.tokens(B);  // Session::plan's range in default mode
    auto tail = cache.find_tail(tokens, run.keys, std::max<int64_t>(1, H - c.window_size + 1), std::min(P - 1, H + B - 1));
    if (!tail) state.SkipWithError("no tail found");
    SequenceState restored = restore_sequence(c, run.payloads(size_t(tail->position / B)), B, &tail->snapshot->tail);
    benchmark::DoNotOptimize(restored.length);
  }
  state.counters["KV MB"] = double(s.kv_bytes()) / 1e6;
  state.SetBytesProcessed(int64_t(state.iterations()) * s.kv_bytes());
}
BENCHMARK(BM_LookupSwaHit)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);

void BM_StoreTurn(benchmark::State& state) {
  const Config c = preset("bench-1gpu");
  const int64_t n = state.range(0);
  KvCache cache(c, options());
  const std::vector<int> tokens = random_tokens(n + 80, 1);
  const SequenceState before = random_state(c, n, 2), after = random_state(c, n + 80, 3);
  cache.store_blocks(std::span(tokens).first(size_t(n)), view_of(before), 0);
  const int64_t stored = n / cache.block_tokens();
  for (auto _ : state) {
    cache.store_blocks(tokens, view_of(after), stored);
    cache.store_tail(tokens, view_of(after));
  }
  state.counters["KV MB"] = double(after.kv_bytes()) / 1e6;
}
BENCHMARK(BM_StoreTurn)->Arg(4096)->Arg(32768)->Unit(benchmark::kMillisecond);

// This process's store directory, in the temporary directory.
std::filesystem::path store_dir() {
  return std::filesystem::temp_directory_path() / ("kv_bench_" + std::to_string(::getpid()));
}

// The store directory holding `tokens`' blocks of `s`, written and flushed by a cache since gone.
std::filesystem::path written_store(const Config& c, std::span<const int> tokens, const SequenceState& s) {
  const std::filesystem::path dir = store_dir();
  std::filesystem::remove_all(dir);
  KvCacheOptions o = options();
  o.store_dir = dir.string();
  KvCache cache(c, o);
  cache.store_blocks(tokens, view_of(s), 0);
  cache.flush();
  return dir;
}

void BM_LookupDiskHit(benchmark::State& state) {
  const Config c = preset("bench-1gpu");
  const int64_t n = state.range(0);
  const std::vector<int> tokens = random_tokens(n + 80, 1);
  const SequenceState s = random_state(c, n, 2);
  const std::filesystem::path dir = written_store(c, std::span(tokens).first(size_t(n)), s);
  int64_t found = 0;
  for (auto _ : state) {
    state.PauseTiming();
    KvCacheOptions o = options();
    o.store_dir = dir.string();
    auto cache = std::make_unique<KvCache>(c, o);  // a restarted engine: its scan is not the lookup's
    state.ResumeTiming();
    const int B = cache->block_tokens();
    BlockRun run = cache->find_blocks(tokens, (int64_t(tokens.size()) - 1) / B);
    SequenceState restored = restore_sequence(c, run.payloads(run.blocks.size()), B, nullptr);
    found = run.tokens(B);
    benchmark::DoNotOptimize(restored.length);
    state.PauseTiming();
    cache.reset();
    state.ResumeTiming();
  }
  if (found != n) state.SkipWithError("the lookup did not find every block");
  std::filesystem::remove_all(dir);
  state.counters["KV MB"] = double(s.kv_bytes()) / 1e6;
  state.SetBytesProcessed(int64_t(state.iterations()) * s.kv_bytes());
}
BENCHMARK(BM_LookupDiskHit)->Arg(32768)->Unit(benchmark::kMillisecond);

void BM_StorePrompt(benchmark::State& state) {
  const Config c = preset("bench-1gpu");
  const int64_t n = state.range(0);
  const std::vector<int> tokens = random_tokens(n, 1);
  const SequenceState s = random_state(c, n, 2);
  const std::filesystem::path dir = store_dir();
  double disk_ms = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::filesystem::remove_all(dir);
    KvCacheOptions o = options();
    o.store_dir = dir.string();
    auto cache = std::make_unique<KvCache>(c, o);
    state.ResumeTiming();
    cache->store_blocks(tokens, view_of(s), 0);
    state.PauseTiming();
    const auto t0 = std::chrono::steady_clock::now();
    cache->flush();
    disk_ms += 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cache.reset();
    state.ResumeTiming();
  }
  std::filesystem::remove_all(dir);
  state.counters["disk_ms"] = disk_ms / double(state.iterations());
  state.counters["blocks"] = double(n / block_tokens(c));
}
BENCHMARK(BM_StorePrompt)->Arg(32768)->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
