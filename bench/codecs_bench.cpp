// Throughput of the KV block codecs on one core: how fast a CPU backend can write (encode) and
// read (decode) cache entries. Reported as entries/s and as bytes of fp32 input or output per
// second; the speed of light is the core's memory bandwidth for streaming that many bytes.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "numerics/codecs.h"

namespace {

using namespace dsv41;

constexpr int kEntries = 4096;

// kEntries vectors of d normal values: the shape of activations entering a cache.
std::vector<float> random_entries(int d) {
  std::vector<float> x(size_t(d) * kEntries);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  return x;
}

template <void (*Encode)(const float*, int, uint8_t*), size_t (*Bytes)(int)>
void BM_Encode(benchmark::State& state) {
  const int d = int(state.range(0)), entries = kEntries;
  std::vector<float> x = random_entries(d);
  std::vector<uint8_t> out(Bytes(d) * entries);
  for (auto _ : state) {
    for (int e = 0; e < entries; ++e) Encode(x.data() + size_t(e) * d, d, out.data() + Bytes(d) * e);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * entries);
  state.SetBytesProcessed(state.iterations() * entries * int64_t(d) * 4);
}

template <void (*Encode)(const float*, int, uint8_t*), void (*Decode)(const uint8_t*, int, float*), size_t (*Bytes)(int)>
void BM_Decode(benchmark::State& state) {
  const int d = int(state.range(0)), entries = kEntries;
  std::vector<float> x = random_entries(d);
  std::vector<uint8_t> packed(Bytes(d) * entries);
  for (int e = 0; e < entries; ++e) Encode(x.data() + size_t(e) * d, d, packed.data() + Bytes(d) * e);
  for (auto _ : state) {
    for (int e = 0; e < entries; ++e) Decode(packed.data() + Bytes(d) * e, d, x.data() + size_t(e) * d);
    benchmark::DoNotOptimize(x.data());
  }
  state.SetItemsProcessed(state.iterations() * entries);
  state.SetBytesProcessed(state.iterations() * entries * int64_t(d) * 4);
}

constexpr size_t kv_fp4_bytes(int d) { return kv_fp4::bytes(d); }
constexpr size_t mxfp4_bytes(int d) { return mxfp4::bytes(d); }
constexpr size_t swa_fp8_bytes(int d) { return swa_fp8::bytes(d); }

BENCHMARK(BM_Encode<kv_fp4::encode, kv_fp4_bytes>)->Name("kv_fp4/encode")->Arg(512);
BENCHMARK(BM_Decode<kv_fp4::encode, kv_fp4::decode, kv_fp4_bytes>)->Name("kv_fp4/decode")->Arg(512);
BENCHMARK(BM_Encode<mxfp4::encode, mxfp4_bytes>)->Name("mxfp4/encode")->Arg(128);
BENCHMARK(BM_Decode<mxfp4::encode, mxfp4::decode, mxfp4_bytes>)->Name("mxfp4/decode")->Arg(128);
BENCHMARK(BM_Encode<swa_fp8::encode, swa_fp8_bytes>)->Name("swa_fp8/encode")->Arg(512);
BENCHMARK(BM_Decode<swa_fp8::encode, swa_fp8::decode, swa_fp8_bytes>)->Name("swa_fp8/decode")->Arg(512);

}  // namespace
