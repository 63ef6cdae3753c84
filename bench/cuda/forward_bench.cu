// The device forward's speed (docs/benchmarks.md, "Device forward (H200)"): decode tokens/s at
// several batch sizes and contexts, and prefill tokens/s in exact and default mode, on a model of
// the given preset with random weights written on the device (a layout checkpoint, so no 23 GB
// file is written), or on a checkpoint directory.
//
// Decode contexts are synthetic: each sequence's caches are filled with valid random codes up to
// the context (KV-FP4 entries, MXFP4 index keys, SWA-FP8 rings), then timed steps run real decode
// over them — the traffic and the work of a step at that context are the real ones; the values
// are not a model's. Bytes per step: every dense weight and the head once, the experts the batch
// touches (expected distinct experts E·(1 - (1 - k/E)^B)), and per token the window, the top-k
// entries of each compressed layer and the index keys each index source scans. Achieved GB/s is
// those bytes over the step time, against a measured device-to-device copy. Decode is timed both
// as a forward_batch call per step (its logits copied to the host, as that call returns them) and
// replaying a DecodeGraph (decode_graph.h) whose logits stay on the device, where the server
// samples them (a batch of 64 rows' 129K logits is 33 MB: copying them out and into per-row
// vectors cost ~20 ms a step); tokens/s and the bandwidth are the graph's, and one more replay
// runs inside the NVTX range "decode step" for Nsight Compute. One more decode step
// per row, and each prompt length's exact prefill a third time, run with op times (op_times.h):
// the device time per op, and the GPU's idle time between ops; the decode step's ops also by kernel
// class (dense projections, MoE, sparse attention, indexer, mHC, other) beside the bytes the model
// above gives each class, so that the bandwidth gap shows by part. --turn N: after each default-mode prefill, a call of N more tokens on the same
// sequence (an agent's next turn on its cached prefix: the compute of an SWA hit's TTFT), timed,
// then once more with op times. --prompt-batch NxP: N fresh sequences of P prompt tokens each in
// one default-mode call (the prefill of `bench serve`'s c64 load: 64x128), timed, then with op times.
// --kernel-trace: after each batch's timed graph steps, as many more under CUPTI (kernel_trace.h):
// each kernel's device time and the GPU's idle time before it, per step, as the graph runs them;
// and each exact prefill a fourth time, traced the same way.
//
//   cuda_forward_bench [--preset bench-1gpu | --model DIR] [--batches 1,8,64]
//                      [--contexts 4096,32768,131072,1048576] [--prefill 4096,32768] [--steps 8]
//                      [--turn 80] [--prompt-batch 64x128] [--kernel-trace] [--json FILE --commit REV]
//
// --json writes every figure as one object: commit, gpu, decode.<batch>.<context>.{ms_per_step, host_launch_us,
// graph_nodes, tokens_per_s, copy_bw_fraction, ops_ms.<op>, idle_ms, classes.<class>.{ms, bytes, gb_per_s}}, prefill.<prompt>.{exact_tokens_per_s, default_tokens_per_s,
// exact_ops_ms.<op>, exact_idle_ms, turn_rows, turn_ms, turn_ops_ms.<op>, turn_idle_ms},
// prompt_batch.{prompts, prompt_tokens, ms, tokens_per_s, ops_ms.<op>, idle_ms}.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "base/error.h"
#include "forward/device/decode_graph.h"
#include "forward/device/device_forward.h"
#include <nlohmann/json.hpp>

#include "backend/cuda/op_times.h"
#include "kernel_trace.h"
#include "model/accounting.h"
#include "model/layout_checkpoint.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

using namespace dsv41;
using namespace dsv41::cuda;

namespace {

std::vector<int64_t> numbers(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(std::stoll(item));
  return out;
}

// entries × bytes: the first `data` bytes of each entry random codes (masked), the rest `scale`.
__global__ void fill_entries(uint8_t* out, int64_t entries, int bytes, int data, uint8_t mask, uint8_t scale, uint64_t seed) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= entries * bytes) return;
  uint64_t z = seed ^ (uint64_t(i) * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  out[i] = int(i % bytes) < data ? uint8_t(z) & mask : scale;
}

void fill(uint8_t* out, int64_t entries, int bytes, int data, uint8_t mask, uint8_t scale, uint64_t seed) {
  if (entries <= 0) return;
  const int64_t n = entries * bytes;
  fill_entries<<<unsigned((n + 255) / 256), 256>>>(out, entries, bytes, data, mask, scale, seed);
  check_launch("fill_entries");
}

// A sequence `context` tokens long, its caches filled with valid random codes.
void synthetic_context(const Config& c, DeviceSequence& s, int64_t context, uint64_t seed) {
  const int hd = c.head_dim, ihd = c.index_head_dim;
  s.length = context;
  for (auto& w : s.window)  // e4m3 codes without the NaN pattern; block scale 2^-4
    fill(w.get(), c.window_size, int(swa_fp8::bytes(hd)), hd, 0x77, uint8_t(127 - 4), seed++);
  for (auto& [layer, d] : s.compressed) {
    const int ratio = c.compress_ratios[size_t(layer)];
    d.entries = context / ratio;
    d.pending = int(context % ratio);
    fill(d.kv.get(), d.entries, int(kv_fp4::bytes(hd)), hd / 2, 0xFF, e4m3_from_float(0.125f), seed++);
    fill(d.index_k.get(), d.entries, int(mxfp4::bytes(ihd)), ihd / 2, 0xFF, uint8_t(127 - 3), seed++);
    if (ratio > 1) {
      check(cudaMemset(d.pending_kv.get(), 0, size_t(d.pending_kv.bytes())), "bench");
      check(cudaMemset(d.pending_score.get(), 0, size_t(d.pending_score.bytes())), "bench");
    }
  }
  check(cudaDeviceSynchronize(), "synthetic context");
}

// Device-to-device copy bandwidth (read + write bytes over time), the reference for GB/s.
double copy_bandwidth() {
  const size_t bytes = size_t(2) << 30;
  DeviceBuffer<uint8_t> a{int64_t(bytes)}, b{int64_t(bytes)};
  check(cudaMemset(a.get(), 1, bytes), "copy");
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0), cudaEventCreate(&t1);
  check(cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice), "copy");
  cudaEventRecord(t0);
  const int reps = 10;
  for (int i = 0; i < reps; ++i) cudaMemcpy(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice);
  cudaEventRecord(t1);
  cudaEventSynchronize(t1);
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  return 2.0 * double(bytes) * reps / (double(ms) * 1e-3);
}

// The weights a decode step reads once whatever the batch (dense = projections + moe + mhc) and
// per routed expert chosen.
struct WeightBytes {
  double projections = 0;  // attention's and the compressor's, the indexer's, Engram's, the norms, the head
  double moe = 0;          // the gates and the shared experts
  double mhc = 0;          // hc_fn of both sub-layers
  double expert = 0;       // one routed expert (w1, w2, w3 with scales), per MoE layer
  double dense() const { return projections + moe + mhc; }
};

WeightBytes weight_bytes(const Model& m) {
  const Config& c = m.config();
  WeightBytes b;
  auto add = [](double& to, const Weight& w) {
    if (w.data) to += double(w.data_bytes() + w.scale_bytes());
  };
  add(b.projections, m.head());
  add(b.projections, m.norm());
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& L = m.layer(l);
    const AttentionWeights& a = L.attn;
    const Weight& wo_a = DeviceModel::placed_wo_a(a, c.o_groups);
    for (const Weight* w : {&L.attn_norm, &L.ffn_norm, &a.wq_a, &a.q_norm, &a.wq_b, &a.wkv, &a.kv_norm, &wo_a, &a.wo_b,
                            &a.compressor_wkv, &a.compressor_wgate, &a.compressor_norm, &a.indexer_wq_b,
                            &a.indexer_weights_proj, &a.indexer_wk, &a.indexer_k_norm})
      add(b.projections, *w);
    for (const Weight* w : {&L.gate, &L.shared.w1, &L.shared.w2, &L.shared.w3}) add(b.moe, *w);
    for (const Weight* w : {&L.hc_attn.fn, &L.hc_ffn.fn}) add(b.mhc, *w);
    if (L.engram) add(b.projections, L.engram->wkv);
  }
  const ExpertWeights& e = m.layer(0).experts.at(0);
  for (const Weight* w : {&e.w1, &e.w2, &e.w3}) add(b.expert, *w);
  return b;
}

// KV bytes one token reads at `context`: its window in every layer and the top-k entries of every
// compressed layer (attention), and the index keys every index source scans (indexer).
struct KvBytes {
  double attention = 0, indexer = 0;
  double total() const { return attention + indexer; }
};
KvBytes kv_bytes_per_token(const Config& c, int64_t context) {
  KvBytes bytes;
  for (int l = 0; l < c.n_layers; ++l) {
    bytes.attention += double(c.window_size) * double(swa_fp8::bytes(c.head_dim));
    const int ratio = c.compress_ratios[size_t(l)];
    if (ratio == 0) continue;
    const double entries = double(context / ratio);
    bytes.attention += std::min<double>(c.index_topk, entries) * double(kv_fp4::bytes(c.head_dim));
    if (c.is_index_source(l)) bytes.indexer += entries * double(mxfp4::bytes(c.index_head_dim));
  }
  return bytes;
}

// A decode step by kernel class: each class's device time (its ops' in the op times), the bytes the
// model says it must move (weights once per step, KV per row, the residual streams through mHC),
// and the bandwidth that makes, as a markdown table and into `classes`.
std::string class_table(const OpTimes& times, const Config& c, const WeightBytes& wb, double expert_bytes, int64_t B,
                        int64_t context, double copy_bw, nlohmann::json& classes) {
  const KvBytes kv = kv_bytes_per_token(c, context);
  // mHC's residual traffic per row and boundary: X and Xo (hc·d each), f and h (d each), fp32.
  const double streams = double(2 * c.hc_mult + 2) * double(c.dim) * 4.0 * double(2 * c.n_layers) * double(B);
  struct Class {
    const char* name;
    double bytes, ms = 0;
  };
  Class cls[] = {{"dense projections", wb.projections},
                 {"MoE (experts, gate, shared)", wb.moe + expert_bytes},
                 {"sparse attention", double(B) * kv.attention},
                 {"indexer", double(B) * kv.indexer},
                 {"mHC", wb.mhc + streams},
                 {"other", 0}};
  auto class_of = [](const std::string& op) {
    auto starts = [&](const char* p) { return op.rfind(p, 0) == 0; };
    if (starts("linear") || starts("head") || starts("compressor") || starts("engram")) return 0;
    if (starts("moe")) return 1;
    if (starts("sparse attention") || starts("window entries")) return 2;
    if (starts("indexer")) return 3;
    if (starts("mhc")) return 4;
    return 5;
  };
  for (const OpTimes::Total& t : times.totals()) cls[class_of(t.name)].ms += t.ms;
  std::string out = "| class | ms | model bytes | GB/s | of copy BW |\n| --- | ---: | ---: | ---: | ---: |\n";
  char line[256];
  for (const Class& k : cls) {
    const double gbps = k.ms > 0 ? k.bytes / (k.ms * 1e-3) / 1e9 : 0;
    std::snprintf(line, sizeof(line), "| %s | %.2f | %.1f MB | %.0f | %.1f%% |\n", k.name, k.ms, k.bytes / 1e6, gbps,
                  100.0 * gbps * 1e9 / copy_bw);
    out += line;
    classes[k.name] = {{"ms", k.ms}, {"bytes", k.bytes}, {"gb_per_s", gbps}};
  }
  return out;
}

struct Inputs {
  std::vector<int> tokens;
  std::vector<int64_t> engram;  // [tokens, engram layers, columns]
};

Inputs random_inputs(const Config& c, int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Inputs in;
  for (int64_t i = 0; i < n; ++i) in.tokens.push_back(int(rng() % uint64_t(c.vocab_size)));
  if (c.has_engram()) {
    const int64_t rows = *std::min_element(c.engram_num_embeddings.begin(), c.engram_num_embeddings.end());
    const int64_t per = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
    for (int64_t i = 0; i < n * per; ++i) in.engram.push_back(int64_t(rng() % uint64_t(rows)));
  }
  return in;
}

// The op times as a markdown table, largest first, and into `ops` (name → ms) and `idle` (the
// GPU's time between ops).
std::string op_table(const OpTimes& times, nlohmann::json& ops, nlohmann::json& idle) {
  std::vector<OpTimes::Total> totals = times.totals();
  std::sort(totals.begin(), totals.end(), [](const OpTimes::Total& a, const OpTimes::Total& b) { return a.ms > b.ms; });
  const double total = times.total_ms();
  double spans = 0;
  std::string out = "| op | calls | ms | share |\n| --- | ---: | ---: | ---: |\n";
  char line[256];
  for (const OpTimes::Total& t : totals) {
    std::snprintf(line, sizeof(line), "| %s | %d | %.2f | %.1f%% |\n", t.name.c_str(), t.calls, t.ms, 100.0 * t.ms / total);
    out += line;
    spans += t.ms;
    ops[t.name] = t.ms;
  }
  std::snprintf(line, sizeof(line), "| (GPU idle between ops) | | %.2f | %.1f%% |\n| all | | %.2f | |\n", total - spans,
                100.0 * (total - spans) / total, total);
  idle = total - spans;
  return out + line;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string preset_name = "bench-1gpu", model_dir, json_path, commit = "unknown";
  std::vector<int64_t> batches = {1, 8, 64}, contexts = {4096, 32768, 131072, 1048576}, prefills = {4096, 32768};
  int steps = 8;
  int64_t turn = 0, batch_prompts = 0, batch_prompt_tokens = 0;
  bool kernel_trace = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--kernel-trace") {
      if (!bench::KernelTrace::available())
        fail("cuda_forward_bench", "a build with CUPTI for --kernel-trace", "CUDA::cupti not found at configure time");
      kernel_trace = true;
      continue;
    }
    if (i + 1 == argc) fail("cuda_forward_bench", "a value after " + flag, "the end of the arguments");
    const std::string value = argv[++i];
    if (flag == "--preset") preset_name = value;
    else if (flag == "--model") model_dir = value;
    else if (flag == "--batches") batches = numbers(value);
    else if (flag == "--contexts") contexts = numbers(value);
    else if (flag == "--prefill") prefills = numbers(value);
    else if (flag == "--steps") steps = int(std::stoi(value));
    else if (flag == "--json") json_path = value;
    else if (flag == "--commit") commit = value;
    else if (flag == "--turn") turn = int64_t(std::stoll(value));
    else if (flag == "--prompt-batch") {
      const size_t x = value.find('x');
      if (x == std::string::npos) fail("cuda_forward_bench", "--prompt-batch NxP (e.g. 64x128)", value);
      batch_prompts = std::stoll(value.substr(0, x)), batch_prompt_tokens = std::stoll(value.substr(x + 1));
      if (batch_prompts < 1 || batch_prompt_tokens < 1) fail("cuda_forward_bench", "--prompt-batch with N, P >= 1", value);
    } else
      fail("cuda_forward_bench", "--preset, --model, --batches, --contexts, --prefill, --steps, --turn, --prompt-batch, --kernel-trace, --json or --commit", flag);
  }
  nlohmann::json report = {{"commit", commit}};
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  std::printf("device: %s, %.1f GiB\n", prop.name, double(prop.totalGlobalMem) / double(1 << 30));
  const double copy_bw = copy_bandwidth();
  report["gpu"] = prop.name;
  report["copy_bytes_per_s"] = copy_bw;
  std::printf("device-to-device copy: %.0f GB/s\n", copy_bw / 1e9);

  const bool random = model_dir.empty();
  if (random) {
    model_dir = (std::filesystem::temp_directory_path() / ("dsv41-layout-" + preset_name)).string();
    if (!std::filesystem::exists(model_dir + "/config.json")) write_layout_checkpoint(preset(preset_name), model_dir);
  }
  auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = Model::load(model_dir);
  DeviceModel dm(*model, random ? DeviceModel::Values::Random : DeviceModel::Values::Checkpoint, 1);
  const Config& c = model->config();
  std::printf("model: %s (%s), %.2f GB on the device, loaded in %.1f s\n", random ? preset_name.c_str() : model_dir.c_str(),
              random ? "random weights" : "checkpoint", double(dm.bytes()) / 1e9,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  const WeightBytes wb = weight_bytes(*model);
  const int k = c.n_activated_experts, E = c.n_routed_experts;
  int moe_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) moe_layers += !model->layer(l).experts.empty();

  struct DecodeBreakdown {
    int64_t batch, context;
    std::string table, classes, trace;
  };
  std::vector<DecodeBreakdown> decode_breakdown;
  std::printf("\n| batch | context | ms / step, calls | ms / step, graph | graph nodes | host µs to launch | tokens/s | bytes / token | achieved GB/s | of copy BW |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (int64_t context : contexts)
    for (int64_t B : batches) {
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      const double need = double(B) * (c.n_layers * 1.0 * c.window_size * swa_fp8::bytes(c.head_dim) +
                                       account(c, 1).kv.global_bytes_per_token * double(context + 3 * steps + 8)) * 1.05 + 4e9;
      if (need > double(free_bytes)) {
        std::printf("| %lld | %lld | (needs %.0f GB, %.0f free) | | | | |\n", (long long)B, (long long)context, need / 1e9,
                    double(free_bytes) / 1e9);
        continue;
      }
      // Each step from the host's view, first as one forward_batch call per step (plan, launches,
      // logits back), then replaying a DecodeGraph (plan, one launch, the step waited for); two
      // warm-up steps each (the graph's first step captures it).
      std::vector<std::unique_ptr<DeviceSequence>> seqs;
      std::vector<DeviceSequence*> ptrs;
      for (int64_t b = 0; b < B; ++b) {
        seqs.push_back(std::make_unique<DeviceSequence>(c, context + 3 * steps + 8));  // + the traced steps
        synthetic_context(c, *seqs.back(), context, uint64_t(b) * 1000 + 7);
        ptrs.push_back(seqs.back().get());
      }
      const Inputs in = random_inputs(c, B * (2 * steps + 6), uint64_t(context + B));
      const int64_t per = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
      std::unique_ptr<DecodeGraph> graph;
      OpTimes* times = nullptr;  // set for the one step that keeps op times
      double launch_s = 0;       // the host's time in DecodeGraph::launch (plan, plan copy, launch) over the timed steps
      auto step = [&](int s, bool graphed) {
        std::vector<DeviceItem> items;
        std::vector<int32_t> tokens;
        std::vector<const int64_t*> ids;
        for (int64_t b = 0; b < B; ++b) {
          const int64_t at = s * B + b;
          const int64_t* id = c.has_engram() ? in.engram.data() + at * per : nullptr;
          items.push_back({seqs[size_t(b)].get(), std::span<const int>(in.tokens).subspan(size_t(at), 1), id});
          tokens.push_back(in.tokens[size_t(at)]);
          if (id) ids.push_back(id);
        }
        if (graphed) {
          const auto t0 = std::chrono::steady_clock::now();
          graph->launch(tokens, ids);
          launch_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          check(cudaStreamSynchronize(graph->stream()), "decode graph");
        } else {
          forward_batch(dm, items, nullptr, times);
        }
      };
      auto timed = [&](int first, bool graphed) {
        step(first, graphed), step(first + 1, graphed);
        launch_s = 0;
        const auto start = std::chrono::steady_clock::now();
        for (int s = first + 2; s < first + 2 + steps; ++s) step(s, graphed);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
      };
      const double calls_s = timed(0, false);
      double step_s = calls_s, launch_us = 0;
      if (B <= kDecodeGraphRows) {
        graph = std::make_unique<DecodeGraph>(dm, ptrs);
        step_s = timed(steps + 2, true);
        launch_us = launch_s / steps * 1e6;
        // One more replay inside an NVTX range, for a profiler to take one whole step and nothing
        // else: ncu --nvtx --nvtx-include "decode step/" --graph-profiling node (docs/cuda.md).
        nvtxRangePushA("decode step");
        step(2 * steps + 4, true);
        nvtxRangePop();
      }
      std::string trace;
      if (kernel_trace && graph) {
        bench::KernelTrace tracer;
        tracer.start();
        for (int s = 0; s < steps; ++s) step(s, true);
        tracer.stop();
        trace = tracer.table(steps);
      }
      const double experts = double(E) * (1.0 - std::pow(1.0 - double(k) / E, double(B)));
      const double expert_bytes = moe_layers * experts * wb.expert;
      const double step_bytes = wb.dense() + expert_bytes + double(B) * kv_bytes_per_token(c, context).total();
      std::printf("| %lld | %lld | %.2f | %.2f | %zu | %.0f | %.1f | %.2f GB | %.0f | %.1f%% |\n", (long long)B, (long long)context,
                  calls_s * 1e3, step_s * 1e3, graph ? graph->nodes() : size_t(0), launch_us,
                  double(B) / step_s, step_bytes / double(B) / 1e9, step_bytes / step_s / 1e9,
                  100.0 * step_bytes / step_s / copy_bw);
      std::fflush(stdout);
      nlohmann::json& row = report["decode"][std::to_string(B)][std::to_string(context)];
      row = {{"ms_per_step", step_s * 1e3}, {"tokens_per_s", double(B) / step_s}, {"copy_bw_fraction", step_bytes / step_s / copy_bw},
             {"graph_nodes", graph ? graph->nodes() : size_t(0)}, {"host_launch_us", launch_us}};
      // One more step as a forward_batch call with op times: where a decode step goes.
      OpTimes decode_times;
      times = &decode_times;
      step(2 * steps + 5, false);
      check(cudaDeviceSynchronize(), "decode");
      decode_breakdown.push_back({B, context, op_table(decode_times, row["ops_ms"], row["idle_ms"]),
                                  class_table(decode_times, c, wb, expert_bytes, B, context, copy_bw, row["classes"]),
                                  trace});
    }

  std::printf("\n| prompt | mode | seconds | tokens/s | weight TFLOP/s | default / exact |\n| ---: | --- | ---: | ---: | ---: | ---: |\n");
  const Accounting acc = account(c, 1);
  std::vector<std::pair<int64_t, std::unique_ptr<OpTimes>>> breakdowns, turn_breakdowns;
  std::vector<std::pair<int64_t, std::string>> prefill_traces;
  std::string turn_rows;
  for (int64_t P : prefills) {
    double exact_s = 0;
    // Exact, default, then exact again with op times, and once more traced (--kernel-trace).
    for (int run = 0; run < (kernel_trace ? 4 : 3); ++run) {
      const bool exact = run != 1;
      DeviceSequence seq(c, P + 2 * turn + 1);
      const Inputs in = random_inputs(c, P, uint64_t(P));
      DeviceItem item{&seq, in.tokens, c.has_engram() ? in.engram.data() : nullptr};
      if (!exact) item.options.decoder_from = P - std::min<int64_t>(c.window_size, P);
      std::unique_ptr<OpTimes> times = run == 2 ? std::make_unique<OpTimes>() : nullptr;
      bench::KernelTrace tracer;
      check(cudaDeviceSynchronize(), "prefill");
      if (run == 3) tracer.start();
      const auto start = std::chrono::steady_clock::now();
      forward_batch(dm, {item}, nullptr, times.get());
      check(cudaDeviceSynchronize(), "prefill");
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (run == 3) {
        tracer.stop();
        prefill_traces.emplace_back(P, tracer.table(1));
        continue;
      }
      if (times) {
        breakdowns.emplace_back(P, std::move(times));
        continue;
      }
      if (!exact && turn > 0) {
        // The next turn, twice: timed, then with op times (at P + turn: the same work within a turn).
        for (int t = 0; t < 2; ++t) {
          const Inputs next = random_inputs(c, turn, uint64_t(P + 7 + t));
          DeviceItem call{&seq, next.tokens, c.has_engram() ? next.engram.data() : nullptr};
          call.options.decoder_from = seq.length + turn - std::min<int64_t>(c.window_size, turn);
          std::unique_ptr<OpTimes> turn_times = t == 1 ? std::make_unique<OpTimes>() : nullptr;
          check(cudaDeviceSynchronize(), "turn");
          const auto t0 = std::chrono::steady_clock::now();
          forward_batch(dm, {call}, nullptr, turn_times.get());
          check(cudaDeviceSynchronize(), "turn");
          const double ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (turn_times) {
            turn_breakdowns.emplace_back(P, std::move(turn_times));
            continue;
          }
          turn_rows += "| " + std::to_string(P) + " | " + std::to_string(turn) + " | " + std::to_string(ms).substr(0, 6) + " |\n";
          report["prefill"][std::to_string(P)]["turn_rows"] = turn;
          report["prefill"][std::to_string(P)]["turn_ms"] = ms;
        }
      }
      if (exact) exact_s = s;
      const double flops = 2.0 * double(exact ? acc.params.active_prefill_exact : acc.params.active_prefill) * double(P);
      std::printf("| %lld | %s | %.2f | %.0f | %.1f | %s |\n", (long long)P, exact ? "exact" : "default", s, double(P) / s,
                  flops / s / 1e12, exact ? "" : (std::to_string(s / exact_s).substr(0, 5)).c_str());
      std::fflush(stdout);
      report["prefill"][std::to_string(P)][exact ? "exact_tokens_per_s" : "default_tokens_per_s"] = double(P) / s;
    }
  }
  // Where the time goes: each op's device time, largest first.
  for (const auto& [B, context, table, classes, trace] : decode_breakdown) {
    std::printf("\nDecode step, batch %lld at %lld context, device time per op (one forward_batch call):\n\n%s\n"
                "The same step by kernel class, against the bytes the model says each must move:\n\n%s",
                (long long)B, (long long)context, table.c_str(), classes.c_str());
    if (!trace.empty())
      std::printf("\nThe same step as the decode graph runs it, by kernel (CUPTI), per step:\n\n%s", trace.c_str());
  }
  for (const auto& [P, times] : breakdowns) {
    nlohmann::json& row = report["prefill"][std::to_string(P)];
    std::printf("\nExact prefill of %lld tokens, device time per op:\n\n%s", (long long)P,
                op_table(*times, row["exact_ops_ms"], row["exact_idle_ms"]).c_str());
  }
  for (const auto& [P, trace] : prefill_traces)
    std::printf("\nExact prefill of %lld tokens by kernel (CUPTI, no op times):\n\n%s", (long long)P, trace.c_str());
  if (!turn_rows.empty())
    std::printf("\nA turn after a default-mode prefill (one call on the same sequence):\n\n| prompt | turn tokens | ms |\n"
                "| ---: | ---: | ---: |\n%s",
                turn_rows.c_str());
  for (const auto& [P, times] : turn_breakdowns) {
    nlohmann::json& row = report["prefill"][std::to_string(P)];
    std::printf("\nA turn of %lld tokens after %lld, device time per op:\n\n%s", (long long)turn, (long long)P,
                op_table(*times, row["turn_ops_ms"], row["turn_idle_ms"]).c_str());
  }
  if (batch_prompts > 0) {
    // N fresh sequences prefilled in one default-mode call: timed, then again with op times.
    const int64_t N = batch_prompts, P = batch_prompt_tokens;
    const Inputs in = random_inputs(c, N * P, uint64_t(N * 1000 + P));
    const int64_t per = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
    OpTimes prompt_times;
    double ms = 0;
    for (int run = 0; run < 2; ++run) {
      std::vector<std::unique_ptr<DeviceSequence>> seqs;
      std::vector<DeviceItem> items;
      for (int64_t b = 0; b < N; ++b) {
        seqs.push_back(std::make_unique<DeviceSequence>(c, P + 8));
        DeviceItem item{seqs.back().get(), std::span<const int>(in.tokens).subspan(size_t(b * P), size_t(P)),
                        c.has_engram() ? in.engram.data() + b * P * per : nullptr};
        item.options.decoder_from = P - std::min<int64_t>(c.window_size, P);
        items.push_back(item);
      }
      check(cudaDeviceSynchronize(), "prompt batch");
      const auto t0 = std::chrono::steady_clock::now();
      forward_batch(dm, items, nullptr, run == 1 ? &prompt_times : nullptr);
      check(cudaDeviceSynchronize(), "prompt batch");
      if (run == 0) ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    nlohmann::json& row = report["prompt_batch"];
    row["prompts"] = N, row["prompt_tokens"] = P, row["ms"] = ms, row["tokens_per_s"] = double(N * P) / (ms / 1e3);
    std::printf("\n%lld prompts of %lld tokens in one default-mode call: %.1f ms, %.0f tokens/s; device time per op:\n\n%s",
                (long long)N, (long long)P, ms, double(N * P) / (ms / 1e3), op_table(prompt_times, row["ops_ms"], row["idle_ms"]).c_str());
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << report.dump(2) << "\n";
    std::printf("\nwrote %s\n", json_path.c_str());
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_forward_bench: %s\n", e.what());
  return 1;
}
