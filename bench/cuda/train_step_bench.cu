// A training step of the CUDA trainer (src/train/cuda/model, docs/training.md "The CUDA trainer")
// on the embedded default's architecture (assets/default-model/config.json: dim 384, 8 layers)
// at the default's step (configs/default-model.json: 32 sequences of 512 tokens, 16 DSpark blocks
// each, every QAT switch): the batch's forward, then its backward, each timed to its end on the
// device. Random initialisation and random tokens: the step's work does not depend on the values
// beyond the gate's and the indexer's choices. The optimizer's update is not here (it needs the
// full build's optimizers: `dsv41 train` reports it).
//
// Counters: tokens/s of forward + backward, the forward's and the backward's ms, and the model's
// TFLOP/s as 6 × the parameters a token's products read × tokens over the step's time — the figure
// docs/benchmarks.md compares with the bf16 tensor peak. Batches of 32 (the default's step) and 128
// sequences: how the step's time grows with its rows says how much of it is per launch and per
// download rather than per row.
//
// --kernel-trace: after each batch's timed steps, one more under CUPTI (kernel_trace.h), its
// kernels' table printed: where a step's device time goes, and how much of the step the device idles.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string_view>
#include <vector>

#include "backend/cuda/check.h"
#include "kernel_trace.h"
#include "model/config.h"
#include "train/cuda/model/cuda_train_model.h"
#include "train/cuda/model/device_parameters.h"
#include "train/model/parameters.h"
#include "train/model/train_model.h"

namespace {

using namespace dsv41;

bool kernel_trace = false;

// The parameters one token's products read in the target model: its Dense and Head matrices, the
// routed experts at top-k of n_routed_experts; not lookups (embeddings, Engram tables), vectors,
// nor DSpark's drafter, which runs on the draft blocks' rows only (so the figure understates).
double active_matrix_parameters(const train::Parameters<float>& p, const Config& c) {
  double n = 0;
  for (const train::Param<float>& t : p.all()) {
    if (t.shape.size() < 2 || t.group == WeightGroup::DSpark) continue;
    if (t.role == WeightRole::Dense || t.role == WeightRole::Head) n += double(t.numel());
    if (t.role == WeightRole::RoutedExpert) n += double(t.numel()) * c.n_activated_experts / c.n_routed_experts;
  }
  return n;
}

void BM_TrainStep(benchmark::State& state) {
  const Config c = load_config(DSV41_SOURCE_DIR "/assets/default-model/config.json");
  const int64_t B = state.range(0), L = 512, blocks = 16;
  train::Parameters<float> host(c);
  train::init_parameters(host, {});
  train_cuda::DeviceParameters dev(host);
  dev.upload();
  train_cuda::CudaTrainModel model(host, dev, train::TrainOptions{.kv_fp4 = true, .swa_fp8 = true, .mxfp4_indexer = true});

  struct Sequence {
    std::vector<int64_t> tokens, engram_ids, anchors;
  };
  std::mt19937_64 rng(1);
  std::vector<Sequence> seqs(static_cast<size_t>(B));
  std::vector<train::TrainSequence> batch;
  for (int64_t s = 0; s < B; ++s) {
    Sequence& q = seqs[size_t(s)];
    for (int64_t i = 0; i <= L; ++i) q.tokens.push_back(int64_t(rng() % uint64_t(c.vocab_size)));
    for (int64_t t = 0; t < L; ++t)
      for (int64_t rows : c.engram_num_embeddings)
        for (int j = 0; j < c.engram_hash_columns(); ++j) q.engram_ids.push_back(int64_t(rng() % uint64_t(rows)));
    if (c.has_dspark()) q.anchors = train::dspark_anchors(c, L, blocks, 1, uint64_t(s));
    batch.push_back({q.tokens, q.engram_ids.empty() ? nullptr : q.engram_ids.data(), q.anchors, {}});
  }
  using clock = std::chrono::steady_clock;
  auto step = [&](double* forward_s, double* backward_s) {
    dev.zero_grad();
    const auto t0 = clock::now();
    model.forward(batch);
    cuda::check(cudaDeviceSynchronize(), "forward");
    const auto t1 = clock::now();
    model.backward();
    cuda::check(cudaDeviceSynchronize(), "backward");
    const auto t2 = clock::now();
    *forward_s = std::chrono::duration<double>(t1 - t0).count();
    *backward_s = std::chrono::duration<double>(t2 - t1).count();
  };
  // Warm-up steps: the first ones load kernels and fill cuBLASLt's algorithm cache.
  double f = 0, b = 0, forward = 0, backward = 0;
  for (int i = 0; i < 3; ++i) step(&f, &b);
  for (auto _ : state) {
    step(&f, &b);
    forward += f, backward += b;
    state.SetIterationTime(f + b);
  }
  const double steps = double(state.iterations()), tokens = double(B * L);
  state.counters["forward_ms"] = 1e3 * forward / steps;
  state.counters["backward_ms"] = 1e3 * backward / steps;
  state.counters["tokens_per_s"] = tokens * steps / (forward + backward);
  state.counters["model_tflops"] = 6.0 * active_matrix_parameters(host, c) * tokens * steps / (forward + backward) / 1e12;
  if (kernel_trace) {
    bench::KernelTrace trace;
    trace.start();
    step(&f, &b);
    trace.stop();
    std::printf("\n## BM_TrainStep/%lld: one step's kernels (forward %.1f ms, backward %.1f ms)\n\n%s\n",
                static_cast<long long>(B), 1e3 * f, 1e3 * b, trace.table(1).c_str());
  }
}

}  // namespace

BENCHMARK(BM_TrainStep)->Arg(32)->Arg(128)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(2.0);

int main(int argc, char** argv) {
  std::vector<char*> args;  // Google Benchmark's flags, without ours
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) != "--kernel-trace") {
      args.push_back(argv[i]);
      continue;
    }
    if (!dsv41::bench::KernelTrace::available()) {
      std::fprintf(stderr, "cuda_train_step_bench: --kernel-trace needs a build with CUPTI (CUDA::cupti not found at configure time)\n");
      return 2;
    }
    kernel_trace = true;
  }
  int n = int(args.size());
  benchmark::Initialize(&n, args.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
