// The CPU forward on random checkpoints (quantized as released: fp8 dense, fp4 experts): prefill
// tokens/s in exact and default (decoder bounded replay) mode, and decode tokens/s, for `tiny` and
// the larger `small` preset.
// Weights are read straight from the mapped checkpoint, so decode is bounded by how fast the
// active weights stream from memory; the counters report the active bytes per token.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>

#include "engine/session.h"
#include "model/accounting.h"
#include "model/random_checkpoint.h"

namespace {

using namespace dsv41;

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

// One random checkpoint per preset, written once per process under the temp directory.
const Loaded& loaded(const std::string& name) {
  static std::map<std::string, Loaded> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  const auto dir = std::filesystem::temp_directory_path() / ("dsv41_forward_bench_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  RandomCheckpointOptions opt;
  opt.quantized = true;
  write_random_checkpoint(preset(name), dir.string(), opt);
  Loaded l{Model::load(dir.string()), std::make_unique<Tokenizer>(Tokenizer::from_file(dir.string() + "/tokenizer.json"))};
  return cache.emplace(name, std::move(l)).first->second;
}

std::vector<int> prompt(int64_t n, int64_t vocab) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int(3 + (i * 7919) % (vocab - 3));
  return ids;
}

void BM_Prefill(benchmark::State& state, const std::string& name, Mode mode) {
  const Loaded& l = loaded(name);
  const std::vector<int> ids = prompt(state.range(0), l.model->config().vocab_size);
  for (auto _ : state) {
    Session session(*l.model, l.tokenizer.get(), mode);
    benchmark::DoNotOptimize(session.prefill(ids));
  }
  state.counters["tokens/s"] = benchmark::Counter(double(state.iterations() * state.range(0)), benchmark::Counter::kIsRate);
}

void BM_Decode(benchmark::State& state, const std::string& name) {
  const Loaded& l = loaded(name);
  Session session(*l.model, l.tokenizer.get());
  session.prefill(prompt(state.range(0), l.model->config().vocab_size));
  int next = 5;
  for (auto _ : state) benchmark::DoNotOptimize(session.decode(next));
  state.counters["tokens/s"] = benchmark::Counter(double(state.iterations()), benchmark::Counter::kIsRate);
  state.counters["active_params"] = double(account(l.model->config(), 1).params.active_decode);
}

BENCHMARK_CAPTURE(BM_Prefill, tiny_exact, std::string("tiny"), Mode::Exact)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Prefill, tiny_default, std::string("tiny"), Mode::Default)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, tiny, std::string("tiny"))->Arg(256)->Iterations(64)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Prefill, small_exact, std::string("small"), Mode::Exact)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Prefill, small_default, std::string("small"), Mode::Default)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Decode, small, std::string("small"))->Arg(256)->Iterations(32)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
