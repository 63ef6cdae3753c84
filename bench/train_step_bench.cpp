// A training step of the trainer's model (src/train/model, docs/training.md "Speed"): the forward
// and backward of one packed sequence on the `tiny` preset (the whole V4.1 schedule at CI's size),
// float masters from the random initialisation, at 64, 256 and 1024 tokens. Counters: tokens/s and
// the CPU seconds per step (the wall time on a shared machine depends on its load).
#include <benchmark/benchmark.h>

#include <ctime>
#include <random>
#include <vector>

#include "model/config.h"
#include "train/model/parameters.h"
#include "train/model/train_model.h"

namespace {

using namespace dsv41;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void BM_TinyStep(benchmark::State& state) {
  const Config c = preset("tiny");
  const int64_t L = state.range(0);
  train::Parameters<float> params(c);
  train::init_parameters(params, {});
  train::TrainModel<float> model(params);
  std::mt19937 rng(1);
  std::vector<int64_t> tokens, ids;
  for (int64_t i = 0; i <= L; ++i) tokens.push_back(int64_t(rng() % uint32_t(c.vocab_size)));
  for (int64_t i = 0; i < L * c.engram_hash_columns(); ++i) ids.push_back(int64_t(rng() % uint64_t(c.engram_num_embeddings[0])));
  // One step first: the process's first allocations of a step's memory (page faults) are not a step's.
  model.forward(tokens, ids.data());
  model.backward();
  const double cpu0 = cpu_seconds();
  for (auto _ : state) {
    params.zero_grad();
    benchmark::DoNotOptimize(model.forward(tokens, ids.data()));
    model.backward();
  }
  state.counters["tokens/s"] = benchmark::Counter(double(state.iterations() * L), benchmark::Counter::kIsRate);
  state.counters["cpu_s/step"] = (cpu_seconds() - cpu0) / double(state.iterations());
}

BENCHMARK(BM_TinyStep)->Arg(64)->Arg(256)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);

}  // namespace
