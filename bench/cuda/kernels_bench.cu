// CUDA kernel benchmarks at V4.1-Flash shapes: achieved bandwidth of the weight GEMV
// (cuda::linear) and of sparse attention decode (cuda::sparse_attention), reported as GB/s next to
// the device's copy bandwidth, which BM_Copy measures in the same run (bytes read + written).
//
// Bytes counted are the fewest each call must move: the weight (and its scales) once, x and y;
// for attention, each token's window and top-k entries in their stored formats, q and out.
// Inputs rotate among copies whose total exceeds the 60 MB L2, so no run is served from cache.
// Times are CUDA-event times of one call (manual time), after warm-up; random, non-zero data.
// The *Graph benchmarks instead replay a CUDA graph of many calls (each on another copy of the
// inputs) and report the time per call: the launch cost the CPU pays per call is gone, as in a
// decode step captured in a graph, and only the GPU's gap between kernels remains; their "Time"
// column is one replay of the whole graph, us_per_call the time per call.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/gemm.cuh"
#include "cublaslt.h"
#include "backend/cuda/indexer.h"
#include "backend/cuda/linear.h"
#include "backend/cuda/mhc.h"
#include "backend/cuda/moe.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sparse_attention.h"
#include "numerics/codecs.h"

namespace dsv41 {
namespace {

using cuda::check;

constexpr size_t kRotateBytes = size_t(512) << 20;  // copies of the inputs span at least this much

// Bytes (h & mask) | base, h a hash of the position and the seed: filled on the device, since
// generating the ≥ 512 MB of rotating copies on the host took longer than the runs' time limits.
__global__ void fill_codes(uint8_t* p, size_t n, uint32_t seed, uint8_t mask, uint8_t base) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(seed) << 40 ^ i) + 0x9E3779B97F4A7C15ull;  // splitmix64
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    p[i] = uint8_t((uint8_t(h ^ (h >> 31)) & mask) | base);
  }
}

// Random bytes whose e4m3 / e2m1 / ue8m0 codes are all valid and modest when mask and base say so.
void* device_codes(size_t bytes, uint32_t seed, uint8_t mask, uint8_t base) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "bench alloc");
  fill_codes<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, seed, mask, base);
  check(cudaGetLastError(), "bench fill");
  check(cudaDeviceSynchronize(), "bench fill");
  return p;
}

void* device_random(size_t bytes, uint32_t seed) { return device_codes(bytes, seed, 0xFF, 0); }

// Times `body` (which launches on the default stream) with events, one call per iteration.
template <typename F>
void time_calls(benchmark::State& state, double bytes, F body) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event"), check(cudaEventCreate(&stop), "event");
  for (int i = 0; i < 3; ++i) body(i);
  check(cudaDeviceSynchronize(), "warm-up");
  int i = 0;
  for (auto _ : state) {
    check(cudaEventRecord(start), "event");
    body(i++);
    check(cudaEventRecord(stop), "event");
    check(cudaEventSynchronize(stop), "event");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "event");
    state.SetIterationTime(ms / 1e3);
  }
  state.SetBytesProcessed(int64_t(bytes) * state.iterations());
  state.counters["GB/s"] = benchmark::Counter(bytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["bytes"] = bytes;
  cudaEventDestroy(start), cudaEventDestroy(stop);
}

// Times a CUDA graph of `calls` calls of body(i, stream). An iteration is one replay (so min_time
// bounds the run's length); GB/s counts `bytes` per call, us_per_call is the replay's time / calls.
template <typename F>
void time_graph(benchmark::State& state, double bytes, int calls, F body) {
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  for (int i = 0; i < calls; ++i) body(i, stream);  // warm-up, scratch pools grown
  check(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < calls; ++i) body(i, stream);
  check(cudaStreamEndCapture(stream, &graph), "capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  check(cudaGraphLaunch(exec, stream), "graph"), check(cudaStreamSynchronize(stream), "graph");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event"), check(cudaEventCreate(&stop), "event");
  double per_call_us = 0;
  for (auto _ : state) {
    check(cudaEventRecord(start, stream), "event");
    check(cudaGraphLaunch(exec, stream), "graph");
    check(cudaEventRecord(stop, stream), "event");
    check(cudaEventSynchronize(stop), "event");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "event");
    state.SetIterationTime(ms / 1e3);
    per_call_us += 1e3 * ms / calls;
  }
  state.SetBytesProcessed(int64_t(bytes * calls) * state.iterations());
  state.counters["GB/s"] = benchmark::Counter(bytes * calls * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["us_per_call"] = benchmark::Counter(per_call_us, benchmark::Counter::kAvgIterations);
  state.counters["bytes"] = bytes;
  cudaEventDestroy(start), cudaEventDestroy(stop);
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(stream);
}

__global__ void copy_kernel(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = in[i];
}

// Device-to-device copy of 2 GiB: the achievable HBM bandwidth, counting bytes read and written.
void BM_Copy(benchmark::State& state) {
  const size_t bytes = size_t(2) << 30;
  void* in = device_random(bytes, 1);
  void* out = nullptr;
  check(cudaMalloc(&out, bytes), "bench alloc");
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attr");
  time_calls(state, 2.0 * bytes, [&](int) {
    copy_kernel<<<sms * 8, 512>>>(static_cast<const float4*>(in), static_cast<float4*>(out), bytes / 16);
  });
  cudaFree(in), cudaFree(out);
}

struct LinearShape {
  const char* name;
  WeightFormat format;
  int N, K;
};
const LinearShape kLinear[] = {
    {"wq_a fp8 1280x5120", WeightFormat::FP8, 1280, 5120},
    {"wq_b fp8 32768x1280", WeightFormat::FP8, 32768, 1280},
    {"wkv fp8 512x5120", WeightFormat::FP8, 512, 5120},
    {"wo_a fp8 8192x4096", WeightFormat::FP8, 8192, 4096},
    {"wo_b fp8 5120x8192", WeightFormat::FP8, 5120, 8192},
    {"expert w1 fp4 2304x5120", WeightFormat::FP4, 2304, 5120},
    {"expert w2 fp4 5120x2304", WeightFormat::FP4, 5120, 2304},
};

void linear_bench(benchmark::State& state, bool graph) {
  const LinearShape& s = kLinear[state.range(0)];
  const int M = int(state.range(1));
  const bool fp8 = s.format == WeightFormat::FP8;
  const size_t data = fp8 ? size_t(s.N) * s.K : size_t(s.N) * s.K / 2;
  const size_t scales = fp8 ? fp8_weight_scale_count(s.N, s.K) : fp4_weight_scale_count(s.N, s.K);
  const int copies = int(std::max<size_t>(1, kRotateBytes / data));
  // e4m3 codes below the NaN code (sign and 7 bits, top exponent excluded), e2m1 any, scales near 2^0.
  std::vector<void*> w, sc;
  for (int c = 0; c < copies; ++c) {
    w.push_back(fp8 ? device_codes(data, 10 + c, 0xB7, 0) : device_random(data, 10 + c));
    sc.push_back(device_codes(scales, 1000 + c, 0x3, 125));
  }
  std::vector<float> xh(size_t(M) * s.K);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (float& v : xh) v = round_bf16(nd(rng));
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(&x, xh.size() * 4), "alloc"), check(cudaMalloc(&y, size_t(M) * s.N * 4), "alloc");
  check(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice), "upload");
  const double bytes = double(data + scales) + 4.0 * M * s.K + 4.0 * M * s.N;
  auto call = [&](int i, cudaStream_t stream) {
    const Weight wt{s.format, s.N, s.K, static_cast<const uint8_t*>(w[size_t(i % copies)]),
                    static_cast<const uint8_t*>(sc[size_t(i % copies)])};
    cuda::linear(x, M, wt, y, stream);
  };
  if (graph) time_graph(state, bytes, std::max(copies, 16), call);
  else time_calls(state, bytes, [&](int i) { call(i, nullptr); });
  state.SetLabel(s.name);
  for (void* p : w) cudaFree(p);
  for (void* p : sc) cudaFree(p);
  cudaFree(x), cudaFree(y);
}

void BM_Linear(benchmark::State& state) { linear_bench(state, false); }
void BM_LinearGraph(benchmark::State& state) { linear_bench(state, true); }

// Mega-mHC at V4.1 (hc 4, d 5120) for `rows` tokens: bytes counted are the residual's
// (2·hc + 2)·d·4 per token (X read, Xo written, f read, h written) plus hc_fn (24 × 20480 fp32,
// 1.97 MB) once per call. Every input, hc_fn included, rotates over copies spanning ≥ 512 MB, as
// a forward reads a different layer's hc_fn at each call.
void BM_MegaMhc(benchmark::State& state) {
  const int rows = int(state.range(0)), hc = 4, d = 5120, n = hc * d, n_mix = (2 + hc) * hc;
  const size_t act = size_t(rows) * (2 * hc + 2) * d * 4, fn_bytes = size_t(n_mix) * n * 4;
  const int copies = int(std::max<size_t>(4, kRotateBytes / (act + fn_bytes)));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  auto upload = [&](size_t count, auto gen) {
    std::vector<float> host(count);
    for (float& v : host) v = gen();
    float* p = nullptr;
    check(cudaMalloc(&p, count * 4), "alloc");
    check(cudaMemcpy(p, host.data(), count * 4, cudaMemcpyHostToDevice), "upload");
    return p;
  };
  auto bf16 = [&] { return round_bf16(nd(rng)); };
  auto unit = [&] { return ud(rng); };
  struct Set {
    float *X, *f, *post, *comb, *pre_in, *fn, *Xo, *h;
  };
  std::vector<Set> sets;
  for (int c = 0; c < copies; ++c) {
    Set s{upload(size_t(rows) * n, bf16), upload(size_t(rows) * d, bf16), upload(size_t(rows) * hc, unit),
          upload(size_t(rows) * hc * hc, unit), upload(size_t(rows) * hc, unit),
          upload(size_t(n_mix) * n, [&] { return round_bf16(0.007f * nd(rng)); }), nullptr, nullptr};
    check(cudaMalloc(&s.Xo, size_t(rows) * n * 4), "alloc"), check(cudaMalloc(&s.h, size_t(rows) * d * 4), "alloc");
    sets.push_back(s);
  }
  float* base = upload(size_t(n_mix), bf16);
  float* scale = upload(3, unit);
  float* norm = upload(size_t(d), unit);
  float *pre = nullptr, *post = nullptr, *comb = nullptr;
  check(cudaMalloc(&pre, size_t(rows) * hc * 4), "alloc"), check(cudaMalloc(&post, size_t(rows) * hc * 4), "alloc");
  check(cudaMalloc(&comb, size_t(rows) * hc * hc * 4), "alloc");
  const Weight nw{WeightFormat::F32, 1, d, reinterpret_cast<const uint8_t*>(norm), nullptr};
  time_graph(state, double(act + fn_bytes), copies, [&](int i, cudaStream_t stream) {
    const Set& s = sets[size_t(i % copies)];
    const HcWeights w{Weight{WeightFormat::F32, n_mix, n, reinterpret_cast<const uint8_t*>(s.fn), nullptr},
                      Weight{WeightFormat::F32, 1, n_mix, reinterpret_cast<const uint8_t*>(base), nullptr},
                      Weight{WeightFormat::F32, 1, 3, reinterpret_cast<const uint8_t*>(scale), nullptr}};
    cuda::mega_mhc(s.f, s.X, s.post, s.comb, s.pre_in, rows, hc, d, w, &nw, 1e-6f, 20, 1e-6f, s.Xo, s.h, pre, post,
                   comb, stream);
  });
  for (const Set& s : sets)
    for (float* p : {s.X, s.f, s.post, s.comb, s.pre_in, s.fn, s.Xo, s.h}) cudaFree(p);
  cudaFree(base), cudaFree(scale), cudaFree(norm), cudaFree(pre), cudaFree(post), cudaFree(comb);
}

// ---- sparse attention (V4.1-Flash: 64 heads × 512, window 128 SWA-FP8, top-k 512 KV-FP4) ----

const char* path_name(cuda::SparseAttentionPath path) {
  switch (path) {
    case cuda::SparseAttentionPath::automatic: return "automatic";
    case cuda::SparseAttentionPath::head_groups: return "head groups";
    case cuda::SparseAttentionPath::split_tiles: return "split tiles";
    case cuda::SparseAttentionPath::tensor_cores: return "tensor cores";
    case cuda::SparseAttentionPath::split_tensor_cores: return "split tensor cores";
    default: return "warpgroups";
  }
}

// Stored entries with random codes: e4m3 without NaN, e2m1 any, sane scales.
void fill_swa_entries(uint8_t* r, size_t entries, int D, std::mt19937& rng) {
  const size_t swa = swa_fp8::bytes(D);
  for (size_t e = 0; e < entries; ++e) {
    for (int i = 0; i < D; ++i) r[e * swa + i] = uint8_t(rng() & 0xB7);
    for (int i = 0; i < D / 32; ++i) r[e * swa + D + i] = uint8_t(120 + rng() % 8);
  }
}
void fill_kv_entries(uint8_t* k, size_t entries, int D, std::mt19937& rng) {
  const size_t kv = kv_fp4::bytes(D);
  for (size_t e = 0; e < entries; ++e) {
    for (int i = 0; i < D / 2; ++i) k[e * kv + i] = uint8_t(rng());
    for (int i = 0; i < D / 16; ++i) k[e * kv + D / 2 + i] = uint8_t(0x30 + rng() % 16);
  }
}

// A call's device inputs: per token its ring and cache (`copies` sets of B pointers), window
// slots and top-k, q and sink (bf16 normals), and the output.
struct AttentionInputs {
  static constexpr int H = 64, D = 512, W = 128, K = 512;
  int B;
  const uint8_t **rings = nullptr, **caches = nullptr;
  int32_t *window = nullptr, *topk = nullptr;
  float *q = nullptr, *sink = nullptr, *out = nullptr;

  template <class T>
  static T* upload(const std::vector<T>& v) {
    T* d = nullptr;
    check(cudaMalloc(reinterpret_cast<void**>(&d), v.size() * sizeof(T)), "alloc");
    check(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    return d;
  }
  AttentionInputs(int tokens, const std::vector<const uint8_t*>& ring_ptrs, const std::vector<const uint8_t*>& cache_ptrs,
                  const std::vector<int32_t>& window_slots, const std::vector<int32_t>& topk_entries, std::mt19937& rng)
      : B(tokens) {
    std::vector<float> qh(size_t(B) * H * D), sinkh(static_cast<size_t>(H));
    std::normal_distribution<float> nd;
    for (float& v : qh) v = round_bf16(nd(rng));
    for (float& v : sinkh) v = round_bf16(nd(rng));
    rings = upload(ring_ptrs), caches = upload(cache_ptrs);
    window = upload(window_slots), topk = upload(topk_entries);
    q = upload(qh), sink = upload(sinkh);
    check(cudaMalloc(&out, qh.size() * 4), "alloc");
  }
  ~AttentionInputs() {
    cudaFree(rings), cudaFree(caches), cudaFree(window), cudaFree(topk), cudaFree(q), cudaFree(sink), cudaFree(out);
  }
  // The call over pointer set `copy`.
  void run(cuda::SparseAttentionPath path, int copy) const {
    cuda::SparseAttentionBatch batch;
    batch.tokens = B, batch.heads = H, batch.dim = D;
    batch.rings = rings + size_t(copy) * B, batch.window = window, batch.W = W;
    batch.caches = caches + size_t(copy) * B, batch.topk = topk, batch.K = K;
    batch.path = path;
    cuda::sparse_attention(batch, q, sink, 1.0f / std::sqrt(float(D)), out);
  }
  // 2·H·(W + K)·D multiply-adds per token.
  void count_flops(benchmark::State& state) const {
    state.counters["TFLOP/s"] =
        benchmark::Counter(4.0 * H * (W + K) * D * B * state.iterations() / 1e12, benchmark::Counter::kIsRate);
  }
};

// K of `entries` entries, sorted, for each of B tokens.
std::vector<int32_t> random_topk(int B, int K, int entries, std::mt19937& rng) {
  std::vector<int32_t> topk(size_t(B) * K), all(static_cast<size_t>(entries));
  std::iota(all.begin(), all.end(), 0);
  for (int b = 0; b < B; ++b) {
    std::shuffle(all.begin(), all.end(), rng);
    std::sort(all.begin(), all.begin() + K);
    std::copy_n(all.begin(), K, topk.begin() + size_t(b) * K);
  }
  return topk;
}

// Decode: B tokens, each of its own sequence (its own 4,096-entry cache); the path
// (cuda::SparseAttentionPath) as the second argument.
void BM_SparseAttention(benchmark::State& state) {
  using A = AttentionInputs;
  const int B = int(state.range(0)), entries = 4096;
  const auto path = cuda::SparseAttentionPath(state.range(1));
  state.SetLabel(path_name(path));
  const size_t swa = swa_fp8::bytes(A::D), kv = kv_fp4::bytes(A::D);
  const size_t per_token = size_t(A::W) * swa + size_t(entries) * kv;
  const int copies = int(std::max<size_t>(1, kRotateBytes / (per_token * B)));
  std::vector<uint8_t*> rings(static_cast<size_t>(copies)), caches(static_cast<size_t>(copies));
  std::vector<const uint8_t*> ring_ptrs(size_t(copies) * B), cache_ptrs(size_t(copies) * B);
  for (int c = 0; c < copies; ++c) {
    std::vector<uint8_t> r(static_cast<size_t>(B) * A::W * swa), k(static_cast<size_t>(B) * entries * kv);
    std::mt19937 rng(c);
    fill_swa_entries(r.data(), size_t(B) * A::W, A::D, rng);
    fill_kv_entries(k.data(), size_t(B) * entries, A::D, rng);
    rings[size_t(c)] = A::upload(r), caches[size_t(c)] = A::upload(k);
    for (int b = 0; b < B; ++b) {
      ring_ptrs[size_t(c) * B + b] = rings[size_t(c)] + size_t(b) * A::W * swa;
      cache_ptrs[size_t(c) * B + b] = caches[size_t(c)] + size_t(b) * entries * kv;
    }
  }
  std::vector<int32_t> window(size_t(B) * A::W);
  for (int b = 0; b < B; ++b) std::iota(window.begin() + size_t(b) * A::W, window.begin() + size_t(b + 1) * A::W, 0);
  std::mt19937 rng(3);
  const std::vector<int32_t> topk = random_topk(B, A::K, entries, rng);
  const AttentionInputs in(B, ring_ptrs, cache_ptrs, window, topk, rng);
  const double bytes = double(B) * (double(A::W) * swa + double(A::K) * kv + 2.0 * A::H * A::D * 4);
  time_calls(state, bytes, [&](int i) { in.run(path, i % copies); });
  in.count_flops(state);
  for (auto* p : rings) cudaFree(p);
  for (auto* p : caches) cudaFree(p);
}

// A prefill chunk of B tokens of one sequence: every token reads the same ring of 128 SWA entries
// and 512 of the sequence's B/4 compressed entries (the compression ratio 4 of a CSA layer),
// chosen at random, so the entries come from L2 mostly. The second argument is the path. Speed of
// light: 4·H·(W + K)·D FLOP a token on ~990 TFLOP/s of dense bf16.
void BM_SparseAttentionPrefill(benchmark::State& state) {
  using A = AttentionInputs;
  const int B = int(state.range(0)), entries = std::max(B / 4, A::K);
  const auto path = cuda::SparseAttentionPath(state.range(1));
  state.SetLabel(path_name(path));
  const size_t swa = swa_fp8::bytes(A::D), kv = kv_fp4::bytes(A::D);
  std::vector<uint8_t> r(size_t(A::W) * swa), k(size_t(entries) * kv);
  std::mt19937 rng(5);
  fill_swa_entries(r.data(), size_t(A::W), A::D, rng);
  fill_kv_entries(k.data(), size_t(entries), A::D, rng);
  uint8_t *ring = A::upload(r), *cache = A::upload(k);
  std::vector<int32_t> window(size_t(B) * A::W);
  for (int b = 0; b < B; ++b) std::iota(window.begin() + size_t(b) * A::W, window.begin() + size_t(b + 1) * A::W, 0);
  const std::vector<int32_t> topk = random_topk(B, A::K, entries, rng);
  const AttentionInputs in(B, std::vector<const uint8_t*>(size_t(B), ring), std::vector<const uint8_t*>(size_t(B), cache),
                           window, topk, rng);
  const double bytes = double(A::W) * swa + double(entries) * kv + double(B) * 2.0 * A::H * A::D * 4;
  time_calls(state, bytes, [&](int) { in.run(path, 0); });
  in.count_flops(state);
  cudaFree(ring), cudaFree(cache);
}

// Indexer scores of one query against n MXFP4 keys (V4.1: 32 heads × 128): keys once + scores.
void BM_IndexScores(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int heads = 32, hd = 128;
  const size_t kb = mxfp4::bytes(hd), key_bytes = size_t(n) * kb;
  const int copies = int(std::clamp<size_t>(kRotateBytes / key_bytes, 1, 8));
  std::vector<void*> keys;
  for (int c = 0; c < copies; ++c) {
    std::vector<uint8_t> k(key_bytes);
    std::mt19937 rng(c);
    for (size_t t = 0; t < size_t(n); ++t) {
      for (int i = 0; i < hd / 2; ++i) k[t * kb + i] = uint8_t(rng());
      for (int i = 0; i < hd / 32; ++i) k[t * kb + hd / 2 + i] = uint8_t(124 + rng() % 4);
    }
    void* p = nullptr;
    check(cudaMalloc(&p, key_bytes), "alloc");
    check(cudaMemcpy(p, k.data(), key_bytes, cudaMemcpyHostToDevice), "upload");
    keys.push_back(p);
  }
  std::vector<float> qh(size_t(heads) * hd), wh(static_cast<size_t>(heads));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (float& v : qh) v = round_bf16(nd(rng));
  for (float& v : wh) v = round_bf16(0.1f * nd(rng));
  float *q = nullptr, *w = nullptr, *scores = nullptr;
  check(cudaMalloc(&q, qh.size() * 4), "alloc"), check(cudaMalloc(&w, wh.size() * 4), "alloc");
  check(cudaMalloc(&scores, size_t(n) * 4), "alloc");
  check(cudaMemcpy(q, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(w, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice), "upload");
  time_calls(state, double(key_bytes) + 4.0 * n, [&](int i) {
    cuda::index_scores(q, w, 1, heads, hd, static_cast<const uint8_t*>(keys[size_t(i % copies)]), n, nullptr, scores);
  });
  for (void* p : keys) cudaFree(p);
  cudaFree(q), cudaFree(w), cudaFree(scores);
}

// Top-512 of one query's n scores (bf16 values, many ties, as the indexer's): n·4 bytes read once
// counted, though the kernel reads them six times (from L2).
void BM_TopPositions(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<float> sh(static_cast<size_t>(n));
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (float& v : sh) v = round_bf16(nd(rng));
  float* scores = nullptr;
  int32_t* positions = nullptr;
  check(cudaMalloc(&scores, sh.size() * 4), "alloc"), check(cudaMalloc(&positions, 512 * 4), "alloc");
  check(cudaMemcpy(scores, sh.data(), sh.size() * 4, cudaMemcpyHostToDevice), "upload");
  time_calls(state, 4.0 * n, [&](int) { cuda::top_positions(scores, 1, n, 512, positions); });
  cudaFree(scores), cudaFree(positions);
}

// MoE at batch 1, V4.1: the gate (384 × 5120 bf16, fp32 product) and routing; one fp4 expert
// (w1, w3 2304 × 5120, w2 5120 × 2304), rotated over copies.
void BM_Route(benchmark::State& state) {
  const int E = 384, dim = 5120;
  void* gate = nullptr;
  check(cudaMalloc(&gate, size_t(E) * dim * 2), "alloc");
  {
    std::vector<uint16_t> g(size_t(E) * dim);
    std::mt19937 rng(4);
    std::normal_distribution<float> nd;
    for (auto& v : g) v = bf16_from_float(0.02f * nd(rng));
    check(cudaMemcpy(gate, g.data(), g.size() * 2, cudaMemcpyHostToDevice), "upload");
  }
  std::vector<float> xh(static_cast<size_t>(dim)), bh(static_cast<size_t>(E));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (float& v : xh) v = round_bf16(nd(rng));
  for (float& v : bh) v = round_bf16(0.1f * nd(rng));
  float *x = nullptr, *bias = nullptr, *weights = nullptr;
  int32_t* experts = nullptr;
  check(cudaMalloc(&x, xh.size() * 4), "alloc"), check(cudaMalloc(&bias, bh.size() * 4), "alloc");
  check(cudaMalloc(&weights, 6 * 4), "alloc"), check(cudaMalloc(&experts, 6 * 4), "alloc");
  check(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(bias, bh.data(), bh.size() * 4, cudaMemcpyHostToDevice), "upload");
  GateOptions opt;
  opt.topk = 6, opt.route_scale = 1.5f;
  const Weight g{WeightFormat::BF16, E, dim, static_cast<const uint8_t*>(gate), nullptr};
  const Weight b{WeightFormat::F32, 1, E, reinterpret_cast<const uint8_t*>(bias), nullptr};
  time_calls(state, double(E) * dim * 2 + 4.0 * dim, [&](int) { cuda::route(x, 1, g, b, opt, experts, weights); });
  cudaFree(gate), cudaFree(x), cudaFree(bias), cudaFree(weights), cudaFree(experts);
}

void BM_ExpertFfn(benchmark::State& state) {
  const int inter = 2304, dim = 5120, copies = 32;
  const size_t data = size_t(inter) * dim / 2, scales = fp4_weight_scale_count(inter, dim);
  std::vector<void*> buffers;
  std::vector<Weight> w1, w2, w3;
  for (int c = 0; c < copies; ++c)
    for (int m = 0; m < 3; ++m) {
      void* d = device_random(data, uint32_t(100 + 3 * c + m));
      void* s = device_codes(scales, uint32_t(900 + 3 * c + m), 0x3, 125);
      buffers.push_back(d), buffers.push_back(s);
      const bool down = m == 1;
      const Weight w{WeightFormat::FP4, down ? dim : inter, down ? inter : dim, static_cast<const uint8_t*>(d),
                     static_cast<const uint8_t*>(s)};
      (m == 0 ? w1 : m == 1 ? w2 : w3).push_back(w);
    }
  std::vector<float> xh(static_cast<size_t>(dim));
  std::mt19937 rng(6);
  std::normal_distribution<float> nd;
  for (float& v : xh) v = round_bf16(nd(rng));
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(&x, xh.size() * 4), "alloc"), check(cudaMalloc(&y, size_t(dim) * 4), "alloc");
  check(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice), "upload");
  time_calls(state, 3.0 * double(data + scales) + 8.0 * dim, [&](int i) {
    const size_t c = size_t(i % copies);
    cuda::expert_ffn(x, 1, w1[c], w2[c], w3[c], 10.0f, nullptr, y);
  });
  for (void* p : buffers) cudaFree(p);
  cudaFree(x), cudaFree(y);
}

// The MoE sub-layer (cuda::moe) at decode: E fp4 experts of V4.1's shape (w1, w3 2304 × 5120, w2
// 5120 × 2304; E = 16 as bench-1gpu, 384 as V4.1-Flash), an fp8 shared expert, top-6, `rows` rows,
// on the automatic path, in a CUDA graph of 8 calls on 8 inputs. Bytes: the distinct experts the
// calls chose (counted from their outputs), each once with its scales, the shared expert and the
// gate; the floor is those bytes over the copy bandwidth (BM_Copy).
void BM_Moe(benchmark::State& state) {
  const int E = int(state.range(0)), rows = int(state.range(1)), k = 6, dim = 5120, inter = 2304, calls = 8;
  const size_t wbytes = size_t(inter) * dim / 2, sbytes = fp4_weight_scale_count(inter, dim);
  const size_t s8 = size_t(inter) * dim, s8scales = fp8_weight_scale_count(inter, dim);
  std::vector<void*> buffers;
  std::vector<Weight> w1, w2, w3;
  for (int e = 0; e < E; ++e)
    for (int m = 0; m < 3; ++m) {
      void* d = device_random(wbytes, uint32_t(7000 + 3 * e + m));
      void* s = device_codes(sbytes, uint32_t(9000 + 3 * e + m), 0x3, 118);
      buffers.push_back(d), buffers.push_back(s);
      const bool down = m == 1;
      const Weight w{WeightFormat::FP4, down ? dim : inter, down ? inter : dim, static_cast<const uint8_t*>(d),
                     static_cast<const uint8_t*>(s)};
      (m == 0 ? w1 : m == 1 ? w2 : w3).push_back(w);
    }
  Weight shared[3];
  for (int m = 0; m < 3; ++m) {
    void* d = device_codes(s8, uint32_t(500 + m), 0xBF, 0);
    void* s = device_codes(s8scales, uint32_t(600 + m), 0x3, 121);
    buffers.push_back(d), buffers.push_back(s);
    const bool down = m == 1;
    shared[m] = Weight{WeightFormat::FP8, down ? dim : inter, down ? inter : dim, static_cast<const uint8_t*>(d),
                       static_cast<const uint8_t*>(s)};
  }
  const cuda::ExpertTable table(w1, w2, w3);
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> gh(size_t(E) * dim);
  for (auto& v : gh) v = bf16_from_float(0.02f * nd(rng));
  std::vector<float> xh(size_t(calls) * rows * dim), bh(static_cast<size_t>(E));
  for (float& v : xh) v = round_bf16(nd(rng));
  for (float& v : bh) v = round_bf16(0.1f * nd(rng));
  void* gate = nullptr;
  float *x = nullptr, *bias = nullptr, *weights = nullptr, *y = nullptr;
  int32_t* experts = nullptr;
  check(cudaMalloc(&gate, gh.size() * 2), "alloc"), check(cudaMalloc(&x, xh.size() * 4), "alloc");
  check(cudaMalloc(&bias, bh.size() * 4), "alloc"), check(cudaMalloc(&y, xh.size() * 4), "alloc");
  check(cudaMalloc(&weights, size_t(calls) * rows * k * 4), "alloc");
  check(cudaMalloc(&experts, size_t(calls) * rows * k * 4), "alloc");
  check(cudaMemcpy(gate, gh.data(), gh.size() * 2, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(x, xh.data(), xh.size() * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(bias, bh.data(), bh.size() * 4, cudaMemcpyHostToDevice), "upload");
  GateOptions opt;
  opt.topk = k, opt.route_scale = 1.5f;
  const Weight g{WeightFormat::BF16, E, dim, static_cast<const uint8_t*>(gate), nullptr};
  const Weight b{WeightFormat::F32, 1, E, reinterpret_cast<const uint8_t*>(bias), nullptr};
  auto call = [&](int i, cudaStream_t stream) {
    const size_t at = size_t(i % calls) * rows;
    cuda::moe(x + at * dim, rows, g, b, opt, table, shared[0], shared[1], shared[2], 10.0f, nullptr,
              experts + at * k, weights + at * k, y + at * dim, stream);
  };
  for (int i = 0; i < calls; ++i) call(i, nullptr);
  check(cudaDeviceSynchronize(), "moe");
  std::vector<int32_t> chosen(size_t(calls) * rows * k);
  check(cudaMemcpy(chosen.data(), experts, chosen.size() * 4, cudaMemcpyDeviceToHost), "download");
  double distinct = 0;
  for (int i = 0; i < calls; ++i) {
    std::vector<bool> seen(static_cast<size_t>(E));
    for (int j = 0; j < rows * k; ++j) {
      const int32_t e = chosen[size_t(i) * rows * k + size_t(j)];
      distinct += !seen[size_t(e)], seen[size_t(e)] = true;
    }
  }
  distinct /= calls;
  const double bytes = distinct * 3.0 * double(wbytes + sbytes) + 3.0 * double(s8 + s8scales) + 2.0 * E * dim;
  state.counters["experts"] = distinct;
  time_graph(state, bytes, calls, call);
  for (void* p : buffers) cudaFree(p);
  cudaFree(gate), cudaFree(x), cudaFree(bias), cudaFree(y), cudaFree(weights), cudaFree(experts);
}

// ---- the graph's floor: a chain of dependent kernels ----------------------------------------------
// A decode step is a graph of ~1,100 dependent kernels at batch 1 (Nsight Compute); this measures
// what each link costs beyond its own work. Each link reads the previous link's one float and
// `bytes` of a 512 MB weight region (rotating, so from HBM), then writes its sum: the shape of a
// GEMV at one row. mode 0: plain launches; 1: a cudaMallocAsync / cudaFreeAsync of scratch around
// each link, as ops take their scratch (mem-alloc and mem-free nodes between the kernels); 2:
// programmatic dependent launch (PDL), each link waiting for the previous one (griddepcontrol.wait)
// before anything; 3: PDL with the link's weight loads issued before the wait; 4: as 3, and each
// link releases the next at its start (release_dependents). us_per_call: the
// replay's time per link. The floor a decode step pays is links × (us_per_call at 0 bytes).
template <bool kLoadsFirst, bool kRelease>
__global__ void __launch_bounds__(256) chain_kernel(const float4* w, size_t n4, const float* prev, float* next) {
  if (kRelease) cuda::release_dependents();
  float4 v[4] = {};
  const size_t stride = size_t(gridDim.x) * blockDim.x, first = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (kLoadsFirst)
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (first + j * stride < n4) v[j] = __ldg(w + first + j * stride);
  cuda::wait_for_inputs();
  float acc = prev[0];
  for (size_t i = first + (kLoadsFirst ? 4 * stride : 0); i < n4; i += stride) {
    const float4 x = __ldg(w + i);
    acc += x.x + x.y + x.z + x.w;
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) acc += v[j].x + v[j].y + v[j].z + v[j].w;
  if (acc == 12345.0f) next[blockIdx.x] = acc;  // rarely true: keeps the loads, writes almost nothing
  if (threadIdx.x == 0 && blockIdx.x == 0) next[0] = prev[0] + 1.0f;
}

void BM_GraphChain(benchmark::State& state) {
  const int mode = int(state.range(0));
  const size_t bytes = size_t(state.range(1)) << 10, region = kRotateBytes;
  float4* w = static_cast<float4*>(device_random(region, 3));
  float* links = nullptr;
  check(cudaMalloc(&links, 2 * 1024 * sizeof(float)), "alloc");
  check(cudaMemset(links, 0, 2 * 1024 * sizeof(float)), "zero");
  const int sms = cuda::multiprocessors("bench"), calls = 512;
  const size_t per_link = std::max<size_t>(bytes / 16, 1), links_in_region = region / 16 / per_link;
  time_graph(state, double(bytes), calls, [&](int i, cudaStream_t stream) {
    const float4* wi = w + (size_t(i) % links_in_region) * per_link;
    const float* prev = links + (i % 2) * 1024;
    float* next = links + (1 - i % 2) * 1024;
    const size_t n4 = bytes / 16;
    void* scratch = nullptr;
    if (mode == 1) check(cudaMallocAsync(&scratch, 4096, stream), "alloc");
    if (mode < 2) chain_kernel<false, false><<<sms, 256, 0, stream>>>(wi, n4, prev, next);
    else if (mode == 2) cuda::launch_early("chain", chain_kernel<false, false>, sms, 256, 0, stream, wi, n4, prev, next);
    else if (mode == 3) cuda::launch_early("chain", chain_kernel<true, false>, sms, 256, 0, stream, wi, n4, prev, next);
    else cuda::launch_early("chain", chain_kernel<true, true>, sms, 256, 0, stream, wi, n4, prev, next);
    check(cudaGetLastError(), "chain");
    if (mode == 1) check(cudaFreeAsync(scratch, stream), "free");
  });
  const char* names[] = {"plain", "scratch alloc and free", "PDL", "PDL, weights before the wait",
                         "PDL, weights before the wait, the next link released at the start"};
  state.SetLabel(names[mode]);
  cudaFree(w), cudaFree(links);
}

// The grouped GEMM's stage loads alone (docs/formats.md, "Routed experts on the device"): 576 CTAs
// of 128 threads (the batch-64 up GEMM's count), each streaming its 128 weight rows of 2,560 bytes
// (fp4 at K = 5120; 189 MB in all) through a ring of 6 cp.async stages and computing nothing. A
// stage is 128 rows × `piece` bytes of row-major rows (piece 64: fp4's k-tile, 128: fp8's), or one
// contiguous run of 128 × 64 bytes (the tile layout). The speed of light of the GEMM's producer.
template <int kStages>
__global__ void __launch_bounds__(128) stage_stream_kernel(const uint8_t* __restrict__ w, int piece, bool runs,
                                                           int64_t row_bytes, float* sink) {
  extern __shared__ uint8_t ring[];
  const int t = int(threadIdx.x), stage_bytes = 128 * piece, tiles = int(row_bytes / piece), per = piece / 16;
  const uint8_t* rows = w + int64_t(blockIdx.x) * 128 * row_bytes;
  const uint32_t ring0 = uint32_t(__cvta_generic_to_shared(ring));
  for (int i = 0; i < tiles + kStages - 1; ++i) {
    if (i < tiles)
      for (int c = t; c < stage_bytes / 16; c += 128) {
        const uint8_t* from = runs ? rows + int64_t(i) * stage_bytes + c * 16 : rows + (c / per) * row_bytes + int64_t(i) * piece + c % per * 16;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(ring0 + (i % kStages) * stage_bytes + c * 16), "l"(from));
      }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1));
    __syncthreads();
  }
  if (t == 0 && ring[0] == 0x5A && ring[1] == 0xA5) sink[blockIdx.x] = 1.0f;  // keeps the loads
}

void BM_StageStream(benchmark::State& state) {
  const int pattern = int(state.range(0)), ctas = 576, piece = pattern == 1 ? 128 : 64;
  const int64_t row_bytes = 2560, bytes = int64_t(ctas) * 128 * row_bytes;
  const int copies = int((kRotateBytes + bytes - 1) / bytes);
  auto* w = static_cast<uint8_t*>(device_random(size_t(bytes) * copies, 5));
  float* sink = nullptr;
  check(cudaMalloc(&sink, ctas * sizeof(float)), "alloc");
  constexpr int kStages = 6;
  const int smem = kStages * 128 * piece;
  check(cudaFuncSetAttribute(stage_stream_kernel<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem");
  time_calls(state, double(bytes), [&](int i) {
    stage_stream_kernel<kStages><<<ctas, 128, smem>>>(w + int64_t(i % copies) * bytes, piece, pattern == 2, row_bytes, sink);
    check(cudaGetLastError(), "stage stream");
  });
  const char* names[] = {"128 rows x 64 B (fp4 row-major)", "128 rows x 128 B (fp8 row-major)", "8 KB runs (tile layout)"};
  state.SetLabel(names[pattern]);
  cudaFree(w), cudaFree(sink);
}

BENCHMARK(BM_Copy)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(BM_StageStream)->DenseRange(0, 2)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_GraphChain)->ArgsProduct({{0, 1, 2, 3, 4}, {0, 256, 4096}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_Linear)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6}, {1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);
BENCHMARK(BM_LinearGraph)
    ->ArgsProduct({{0, 1, 2, 3, 4, 5, 6}, {1, 2, 8}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2);
BENCHMARK(BM_MegaMhc)->ArgsProduct({{1, 8, 16, 31, 32, 64, 256, 4096}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_SparseAttention)
    ->Args({1, 0})
    ->Args({1, 5})
    ->Args({2, 0})
    ->Args({2, 5})
    ->Args({4, 0})
    ->Args({4, 5})
    ->Args({8, 0})
    ->Args({8, 3})
    ->Args({8, 4})
    ->Args({8, 5})
    ->Args({16, 0})
    ->Args({16, 3})
    ->Args({16, 4})
    ->Args({16, 5})
    ->Args({32, 1})
    ->Args({32, 3})
    ->Args({32, 4})
    ->Args({32, 5})
    ->Args({64, 1})
    ->Args({64, 3})
    ->Args({64, 4})
    ->Args({64, 5})
    ->Args({128, 1})
    ->Args({128, 3})
    ->Args({128, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);
BENCHMARK(BM_SparseAttentionPrefill)
    ->ArgsProduct({{64, 132, 256, 1024, 4096}, {3, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);
BENCHMARK(BM_IndexScores)->Arg(65536)->Arg(1 << 20)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_TopPositions)->Arg(65536)->Arg(1 << 20)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_Route)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_ExpertFfn)->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.3);
BENCHMARK(BM_Moe)
    ->ArgsProduct({{16, 384}, {1, 8, 64, 256}})
    ->Args({16, 80})  // an agent turn's rows on an SWA hit (bench-1gpu)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.3);

// ---- indexer at decode: top-k, candidate blocks, the whole step, rows 1, n 4K..1M ---------------------
// Scores are bf16 normals, read from L2 as after the score kernel (bytes counted: the n scores
// once, + the n mask bytes for candidate_mask). mode 0: host n, one call timed with events (launch
// costs included); mode 1: the device-n form (n_max = n) in a CUDA graph of 16 calls, us_per_call.

float* decode_scores(int64_t n) {
  std::vector<float> sh(static_cast<size_t>(n));
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (float& v : sh) v = round_bf16(nd(rng));
  float* scores = nullptr;
  check(cudaMalloc(&scores, sh.size() * 4), "alloc");
  check(cudaMemcpy(scores, sh.data(), sh.size() * 4, cudaMemcpyHostToDevice), "upload");
  return scores;
}

int64_t* device_count(int64_t n) {
  int64_t* p = nullptr;
  check(cudaMalloc(&p, 8), "alloc");
  check(cudaMemcpy(p, &n, 8, cudaMemcpyHostToDevice), "upload");
  return p;
}

void BM_TopKDecode(benchmark::State& state) {
  const int64_t n = state.range(0);
  float* scores = decode_scores(n);
  int64_t* dn = device_count(n);
  int32_t* positions = nullptr;
  check(cudaMalloc(&positions, 512 * 4), "alloc");
  if (state.range(1) == 0) {
    time_calls(state, 4.0 * n, [&](int) { cuda::top_positions(scores, 1, n, 512, positions); });
  } else {
    time_graph(state, 4.0 * n, 16,
               [&](int, cudaStream_t stream) { cuda::top_positions(scores, 1, dn, n, 512, positions, stream); });
  }
  cudaFree(scores), cudaFree(dn), cudaFree(positions);
}

// candidate_mask at V4.1's 2048 blocks of 8.
void BM_CandidateMaskDecode(benchmark::State& state) {
  const int64_t n = state.range(0);
  float* scores = decode_scores(n);
  int64_t* dn = device_count(n);
  uint8_t* mask = nullptr;
  check(cudaMalloc(&mask, size_t(n)), "alloc");
  if (state.range(1) == 0) {
    time_calls(state, 5.0 * n, [&](int) { cuda::candidate_mask(scores, 1, n, dn, 2048, 8, mask); });
  } else {
    time_graph(state, 5.0 * n, 16, [&](int, cudaStream_t stream) {
      cuda::candidate_mask(scores, 1, dn, n, dn, 2048, 8, mask, stream);
    });
  }
  cudaFree(scores), cudaFree(dn), cudaFree(mask);
}

// One layer's indexer at decode as a captured step replays it: index_scores (32 heads × 128) then
// top-512 over `rows` sequences, each its own cache of n entries, both reading the counts from the
// device; one row captured at n_max = 1M and replayed at n, 64 rows (batch-64 decode) at n_max =
// n; time per step (graph of 8 steps). Bytes: the keys + the scores written and read once.
void BM_IndexerStepGraph(benchmark::State& state) {
  const int64_t n = state.range(0), rows = state.range(1), n_max = rows == 1 ? int64_t(1) << 20 : n;
  const int heads = 32, hd = 128;
  const size_t kb = mxfp4::bytes(hd), cache_bytes = size_t(n_max) * kb;
  // e2m1 codes any, scales near 2^0 (e8m0 124..127).
  uint8_t* keys = static_cast<uint8_t*>(device_codes(cache_bytes * size_t(rows), 21, 0xFF, 0));
  {
    std::vector<uint8_t> k(cache_bytes * size_t(rows));
    check(cudaMemcpy(k.data(), keys, k.size(), cudaMemcpyDeviceToHost), "download");
    for (size_t t = 0; t < size_t(n_max * rows); ++t)
      for (int i = 0; i < hd / 32; ++i) k[t * kb + hd / 2 + i] = uint8_t(124 + k[t * kb + hd / 2 + i] % 4);
    check(cudaMemcpy(keys, k.data(), k.size(), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<float> qh(size_t(rows * heads * hd)), wh(size_t(rows * heads));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (float& v : qh) v = round_bf16(nd(rng));
  for (float& v : wh) v = round_bf16(0.1f * nd(rng));
  std::vector<const uint8_t*> caches;
  for (int64_t r = 0; r < rows; ++r) caches.push_back(keys + size_t(r) * cache_bytes);
  const std::vector<int64_t> counts(size_t(rows), n);
  float *q = nullptr, *w = nullptr, *scores = nullptr;
  int32_t* positions = nullptr;
  int64_t* dn = nullptr;
  const uint8_t** dcaches = nullptr;
  check(cudaMalloc(&q, qh.size() * 4), "alloc"), check(cudaMalloc(&w, wh.size() * 4), "alloc");
  check(cudaMalloc(&scores, size_t(rows * n_max) * 4), "alloc"), check(cudaMalloc(&positions, size_t(rows) * 512 * 4), "alloc");
  check(cudaMalloc(&dn, size_t(rows) * 8), "alloc"), check(cudaMalloc(&dcaches, size_t(rows) * 8), "alloc");
  check(cudaMemcpy(q, qh.data(), qh.size() * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(w, wh.data(), wh.size() * 4, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(dn, counts.data(), counts.size() * 8, cudaMemcpyHostToDevice), "upload");
  check(cudaMemcpy(dcaches, caches.data(), caches.size() * 8, cudaMemcpyHostToDevice), "upload");
  time_graph(state, double(rows * n) * (kb + 8), 8, [&](int, cudaStream_t stream) {
    cuda::index_scores(q, w, rows, heads, hd, dcaches, dn, n_max, nullptr, scores, stream);
    cuda::top_positions(scores, rows, dn, n_max, 512, positions, stream);
  });
  cudaFree(keys), cudaFree(q), cudaFree(w), cudaFree(scores), cudaFree(positions), cudaFree(dn), cudaFree(dcaches);
}

BENCHMARK(BM_TopKDecode)
    ->ArgsProduct({{4096, 32768, 262144, 1 << 20}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.1);
BENCHMARK(BM_CandidateMaskDecode)
    ->ArgsProduct({{4096, 32768, 262144, 1 << 20}, {0, 1}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.1);
BENCHMARK(BM_IndexerStepGraph)
    ->ArgsProduct({{4096, 32768, 262144, 1 << 20}, {1}})
    ->ArgsProduct({{1024, 8192, 65536}, {64}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.1);

// ---- Prefill GEMM ----------------------------------------------------------------------------------
// cuda::linear at M ≥ 64 over fp8/fp4 weights (backend/cuda/gemm.cu: act_quant, then bf16 wgmma on
// the exact values of the quantized operands): TFLOP/s at 2·M·N·K per call, act_quant's time
// included, and the fractions of the H200's dense fp8 peak (~1979 TFLOP/s) and dense bf16 peak
// (~989). Its peers on the same shapes: cuBLASLt's bf16 GEMM (BM_GemmCublasLtBf16: the same MMA
// rate, x already bf16, weights bf16 in memory: 2-4× the weight bytes, none of the widening) and
// its fp8 GEMM with per-tensor scales (BM_GemmCublasLtFp8).
// BM_GemmQgemvPasses times the path M > 8 took before, qgemv over the weight in passes of 8 rows
// (cuda::linear on 8 rows at a time), on the same data. BM_GemmTiling forces gemm.cuh's wide (1)
// or narrow (2) tiling at decode-sized M, where the weight's bytes set the speed of light (the
// bytes_per_second counter against the H200's ~4.3 TB/s copy).
const LinearShape kGemmBench[] = {
    {"wq_b fp8 32768x1024", WeightFormat::FP8, 32768, 1024},
    {"expert w1 fp4 2048x4096", WeightFormat::FP4, 2048, 4096},
    {"wo_b fp8 4096x8192", WeightFormat::FP8, 4096, 8192},
    {"expert w2 fp4 4096x2048", WeightFormat::FP4, 4096, 2048},
};
constexpr double kFp8DensePeakTflops = 1979;
constexpr double kBf16DensePeakTflops = 989;

// bf16 values in about [-2, 2), from a hash of the position (generated on the device: 10^8 of them).
__global__ void fill_activations(float* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t h = (uint64_t(seed) << 40 ^ i) + 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    const float v = float(int32_t(uint32_t(h >> 32))) * 0x1p-30f;
    p[i] = __uint_as_float(__float_as_uint(v) & 0xFFFF0000u);  // truncated to bf16
  }
}

enum class GemmPath { Linear, QgemvPasses, Tiled };

void gemm_bench(benchmark::State& state, GemmPath path) {
  const LinearShape& s = kGemmBench[state.range(0)];
  const int M = int(state.range(1));
  const bool fp8 = s.format == WeightFormat::FP8;
  const size_t data = fp8 ? size_t(s.N) * s.K : size_t(s.N) * s.K / 2;
  const size_t scales = fp8 ? fp8_weight_scale_count(s.N, s.K) : fp4_weight_scale_count(s.N, s.K);
  // e4m3 codes below the NaN code, e2m1 any, scales near 2^0; two copies of the weight alternate.
  void* w[2];
  void* sc[2];
  for (int c = 0; c < 2; ++c) {
    w[c] = fp8 ? device_codes(data, 20 + c, 0xB7, 0) : device_random(data, 20 + c);
    sc[c] = device_codes(scales, 2000 + c, 0x3, 125);
  }
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(&x, size_t(M) * s.K * 4), "alloc"), check(cudaMalloc(&y, size_t(M) * s.N * 4), "alloc");
  fill_activations<<<1024, 256>>>(x, size_t(M) * s.K, 9);
  check(cudaGetLastError(), "fill"), check(cudaDeviceSynchronize(), "fill");
  const double bytes = double(data + scales) + 4.0 * M * s.K + 4.0 * M * s.N;
  time_calls(state, bytes, [&](int i) {
    const Weight wt{s.format, s.N, s.K, static_cast<const uint8_t*>(w[i % 2]), static_cast<const uint8_t*>(sc[i % 2])};
    if (path == GemmPath::Linear) return cuda::linear(x, M, wt, y);
    if (path == GemmPath::Tiled) return cuda::gemm::linear(x, M, wt, y, nullptr, cuda::gemm::Tiling(state.range(2)));
    for (int m0 = 0; m0 < M; m0 += 8) cuda::linear(x + size_t(m0) * s.K, std::min(8, M - m0), wt, y + size_t(m0) * s.N);
  });
  const double tflop = 2.0 * M * s.N * double(s.K) / 1e12;
  state.counters["TFLOP/s"] = benchmark::Counter(tflop * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["of_fp8_peak"] =
      benchmark::Counter(tflop / kFp8DensePeakTflops * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["of_bf16_peak"] =
      benchmark::Counter(tflop / kBf16DensePeakTflops * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(s.name);
  for (int c = 0; c < 2; ++c) cudaFree(w[c]), cudaFree(sc[c]);
  cudaFree(x), cudaFree(y);
}

// The peers of BM_Gemm on the same shapes, through cuBLASLt: its fp8 GEMM (e4m3 × e4m3 → bf16, one
// scale per tensor: no block scales, and the fp4 experts' shapes as fp8; x already in e4m3) and
// its bf16 GEMM (bf16 × bf16 → fp32, the MMA rate ours runs at; x and W already bf16). Our time
// includes act_quant and the weights' widening.
void cublaslt_peer(benchmark::State& state, bench::LtGemm::Kind kind) {
  const LinearShape& s = kGemmBench[state.range(0)];
  const int M = int(state.range(1));
  const bool fp8 = kind == bench::LtGemm::Kind::Fp8;
  const size_t in = fp8 ? 1 : 2, out = fp8 ? 2 : 4;  // operand and output bytes
  const int mask = fp8 ? 0xB7 : 0xBF;                // e4m3 below the NaN code; bf16 of |v| < 2
  void* w[2] = {device_codes(size_t(s.N) * s.K * in, 40, mask, 0), device_codes(size_t(s.N) * s.K * in, 41, mask, 0)};
  void* x = device_codes(size_t(M) * s.K * in, 42, mask, 0);
  void* y = nullptr;
  check(cudaMalloc(&y, size_t(M) * s.N * out), "alloc");
  std::unique_ptr<bench::LtGemm> gemm;
  try {
    gemm = std::make_unique<bench::LtGemm>(kind, M, s.N, s.K);
    gemm->run(x, w[0], y);  // a shape the heuristic accepts may still be refused here
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    cudaFree(w[0]), cudaFree(w[1]), cudaFree(x), cudaFree(y);
    return;
  }
  const double bytes = double(in) * (double(s.N) * s.K + double(M) * s.K) + double(out) * M * s.N;
  time_calls(state, bytes, [&](int i) { gemm->run(x, w[i % 2], y); });
  const double tflop = 2.0 * M * s.N * double(s.K) / 1e12;
  state.counters["TFLOP/s"] = benchmark::Counter(tflop * state.iterations(), benchmark::Counter::kIsRate);
  state.counters[fp8 ? "of_fp8_peak" : "of_bf16_peak"] = benchmark::Counter(
      tflop / (fp8 ? kFp8DensePeakTflops : kBf16DensePeakTflops) * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(s.name);
  cudaFree(w[0]), cudaFree(w[1]), cudaFree(x), cudaFree(y);
}
void BM_GemmCublasLtFp8(benchmark::State& state) { cublaslt_peer(state, bench::LtGemm::Kind::Fp8); }
void BM_GemmCublasLtBf16(benchmark::State& state) { cublaslt_peer(state, bench::LtGemm::Kind::Bf16); }

// The products over bf16 weights at prefill (gemm_bf16.cu): wo_a (8 groups, linear_grouped) and the
// compressor's projection (linear_f32), beside cuBLASLt's bf16 GEMM (a strided batch for the
// groups) and the gemv's passes of 8 rows that M > 8 took before. TFLOP/s at 2·M·N·K; the
// H200's dense bf16 peak ~989 TFLOP/s (datasheet).
struct Bf16Shape {
  const char* name;
  int groups, N, K;  // N rows per group
};
const Bf16Shape kBf16Bench[] = {
    {"wo_a bf16 8x(1024x4096)", 8, 1024, 4096},
    {"compressor bf16 512x5120", 1, 512, 5120},
};

enum class Bf16Peer { Ours, CublasLt, GemvPasses };

void gemm_bf16_bench(benchmark::State& state, Bf16Peer peer) {
  const Bf16Shape& s = kBf16Bench[state.range(0)];
  const int M = int(state.range(1)), N = s.groups * s.N, K = s.K;
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(&x, size_t(M) * s.groups * K * 4), "alloc"), check(cudaMalloc(&y, size_t(M) * N * 4), "alloc");
  fill_activations<<<1024, 256>>>(x, size_t(M) * s.groups * K, 11);
  check(cudaGetLastError(), "fill"), check(cudaDeviceSynchronize(), "fill");
  void* w[2] = {device_codes(size_t(N) * K * 2, 50, 0xBF, 0), device_codes(size_t(N) * K * 2, 51, 0xBF, 0)};
  std::unique_ptr<bench::LtGemm> lt;
  void* xb = nullptr;
  if (peer == Bf16Peer::CublasLt) {
    xb = device_codes(size_t(M) * s.groups * K * 2, 52, 0xBF, 0);  // bf16 of |v| < 2: no NaN or infinity
    try {
      lt = std::make_unique<bench::LtGemm>(bench::LtGemm::Kind::Bf16, M, s.N, K, s.groups);
      lt->run(xb, w[0], y);
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      cudaFree(w[0]), cudaFree(w[1]), cudaFree(xb), cudaFree(x), cudaFree(y);
      return;
    }
  }
  const double bytes = 2.0 * N * K + (peer == Bf16Peer::CublasLt ? 2.0 : 4.0) * M * s.groups * K + 4.0 * M * N;
  time_calls(state, bytes, [&](int i) {
    const Weight wt{WeightFormat::BF16, N, K, static_cast<const uint8_t*>(w[i % 2]), nullptr};
    if (peer == Bf16Peer::CublasLt) return lt->run(xb, w[i % 2], y);
    for (int m0 = 0; m0 < M; m0 += peer == Bf16Peer::Ours ? M : 8) {
      const int rows = std::min(peer == Bf16Peer::Ours ? M : 8, M - m0);
      cuda::linear_grouped(x + size_t(m0) * s.groups * K, rows, s.groups, wt, y + size_t(m0) * N);
    }
  });
  const double tflop = 2.0 * M * N * double(K) / 1e12;
  state.counters["TFLOP/s"] = benchmark::Counter(tflop * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["of_bf16_peak"] =
      benchmark::Counter(tflop / kBf16DensePeakTflops * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(s.name);
  cudaFree(w[0]), cudaFree(w[1]), cudaFree(xb), cudaFree(x), cudaFree(y);
}

// wo_a (8 groups of 1024 × 4096) at `rows` rows read as the bf16 weight (linear_grouped: the gemv
// at one row, mma.sync from two, the warpgroup MMA from 256) or as the checkpoint's fp8 codes
// widened as they load (linear_grouped_widened: the swapped form to 8 rows, the fp8 GEMM's narrow
// tiles over x's bf16 values below 256, then the bf16 weight's bits from half the bytes), in a
// CUDA graph of 8 calls over 4 copies of the weight (more than L2 holds). Bytes: the weight as
// read, x, y.
void BM_WoA(benchmark::State& state) {
  const int M = int(state.range(0)), groups = 8, r = 1024, K = 4096, N = groups * r;
  const bool fp8 = state.range(1) == 1;
  float *x = nullptr, *y = nullptr;
  check(cudaMalloc(&x, size_t(M) * groups * K * 4), "alloc"), check(cudaMalloc(&y, size_t(M) * N * 4), "alloc");
  fill_activations<<<1024, 256>>>(x, size_t(M) * groups * K, 11);
  check(cudaGetLastError(), "fill"), check(cudaDeviceSynchronize(), "fill");
  constexpr int kCopies = 4;
  const size_t data = fp8 ? size_t(N) * K : size_t(N) * K * 2, scales = fp8 ? size_t(N / 32) * (K / 32) : 0;
  std::vector<void*> w, sc;
  for (int c = 0; c < kCopies; ++c) {
    w.push_back(fp8 ? device_codes(data, 60 + c, 0xB7, 0) : device_codes(data, 60 + c, 0xBF, 0));
    sc.push_back(fp8 ? device_codes(scales, 70 + c, 0x3, 122) : nullptr);
  }
  const double bytes = double(data + scales) + 4.0 * M * groups * K + 4.0 * M * N;
  time_graph(state, bytes, 2 * kCopies, [&](int i, cudaStream_t stream) {
    const Weight wt{fp8 ? WeightFormat::FP8 : WeightFormat::BF16, N, K, static_cast<const uint8_t*>(w[size_t(i % kCopies)]),
                    static_cast<const uint8_t*>(sc[size_t(i % kCopies)])};
    if (fp8) cuda::linear_grouped_widened(x, M, groups, wt, y, stream);
    else cuda::linear_grouped(x, M, groups, wt, y, stream);
  });
  state.SetLabel(fp8 ? "fp8 codes, widened" : "bf16 weight");
  for (int c = 0; c < kCopies; ++c) cudaFree(w[size_t(c)]), cudaFree(sc[size_t(c)]);
  cudaFree(x), cudaFree(y);
}

void BM_GemmBf16(benchmark::State& state) { gemm_bf16_bench(state, Bf16Peer::Ours); }
void BM_GemmBf16CublasLt(benchmark::State& state) { gemm_bf16_bench(state, Bf16Peer::CublasLt); }
void BM_GemmBf16GemvPasses(benchmark::State& state) { gemm_bf16_bench(state, Bf16Peer::GemvPasses); }

void BM_Gemm(benchmark::State& state) { gemm_bench(state, GemmPath::Linear); }
void BM_GemmQgemvPasses(benchmark::State& state) { gemm_bench(state, GemmPath::QgemvPasses); }
void BM_GemmTiling(benchmark::State& state) { gemm_bench(state, GemmPath::Tiled); }

BENCHMARK(BM_Gemm)
    ->ArgsProduct({{0, 1, 2, 3}, {4096}})
    ->Args({0, 64})
    ->Args({1, 64})
    ->Args({0, 512})
    ->Args({1, 512})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2);
BENCHMARK(BM_GemmTiling)
    ->ArgsProduct({{0, 1, 2, 3}, {64, 128, 256}, {1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.1);
BENCHMARK(BM_GemmCublasLtBf16)
    ->ArgsProduct({{0, 1, 2, 3}, {4096}})
    ->Args({0, 64})
    ->Args({1, 64})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2);
BENCHMARK(BM_GemmCublasLtFp8)
    ->ArgsProduct({{0, 1, 2, 3}, {4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.2);
BENCHMARK(BM_WoA)->ArgsProduct({{1, 2, 8, 64, 80, 512}, {0, 1}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_GemmBf16)->ArgsProduct({{0, 1}, {512, 4096}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_GemmBf16CublasLt)->ArgsProduct({{0, 1}, {512, 4096}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
BENCHMARK(BM_GemmBf16GemvPasses)->ArgsProduct({{0, 1}, {4096}})->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.05);
BENCHMARK(BM_GemmQgemvPasses)
    ->ArgsProduct({{0, 1}, {64, 4096}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond)
    ->MinTime(0.05);

}  // namespace
}  // namespace dsv41

BENCHMARK_MAIN();
