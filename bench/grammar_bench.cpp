// The grammar mask's cost per decode step (engine/grammar, issue 23): for a batch of rows each
// under a JSON schema, the constraint's mask for the next token (Sampler::request's share of a
// step) and its advance by the chosen token. The vocabulary is the real one when
// DSV41_TOKENIZER names a tokenizer.json (DeepSeek-V4.1's: 129K tokens), else the test fixture's.
// A row's states repeat across requests and steps: the steady state is a cached mask per state,
// which is what a server sees once a schema has been used. The first request's cost (masks
// built as its states are reached) is BM_GrammarFirstRequest.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>

#include "engine/chat_format.h"
#include "engine/grammar/structured.h"
#include "model/tokenizer/tokenizer.h"

using namespace dsv41;
using namespace dsv41::grammar;

namespace {

const char* const kSchema = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 40},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z]+\\.(com|org)$"},
  "tags": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}, "maxItems": 3},
  "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
              "required": ["city", "zip"]}},
  "required": ["name", "age", "email", "tags", "address"], "additionalProperties": false})";

std::shared_ptr<const Vocabulary> vocabulary() {
  static std::shared_ptr<const Vocabulary> v = [] {
    const char* path = std::getenv("DSV41_TOKENIZER");
    const Tokenizer t = Tokenizer::from_file(path ? path : DSV41_SOURCE_DIR "/tests/data/fixtures/v41-tiny/tokenizer.json");
    return Vocabulary::from_tokenizer(t, int64_t(t.vocab_size()), {*t.token_to_id(chat_token::kEos)});
  }();
  return v;
}

// A reply's tokens under the grammar: random allowed tokens, the mask closing at max_tokens.
std::vector<int> reply(const std::shared_ptr<Grammar>& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  GrammarConstraint c(g, 200);
  std::vector<int> tokens;
  const auto& ends = g->vocabulary().end_tokens();
  for (;;) {
    const auto mask = c.allowed();
    std::vector<int> options;
    for (int t = 0; t < int(g->vocabulary().size()); ++t)
      if (allows(*mask, t)) options.push_back(t);
    const int t = options[rng() % options.size()];
    tokens.push_back(t);
    c.advance(t);
    if (std::find(ends.begin(), ends.end(), t) != ends.end()) return tokens;
  }
}

// Per iteration: one decode step of `batch` rows, each at its own point of its own reply.
void BM_GrammarMaskStep(benchmark::State& state) {
  const int batch = int(state.range(0));
  GrammarCache cache(vocabulary());
  auto g = cache.json_schema(nlohmann::ordered_json::parse(kSchema));
  std::vector<std::vector<int>> replies;
  for (int i = 0; i < 64; ++i) replies.push_back(reply(g, uint64_t(i + 1)));  // warms the masks of their states
  std::vector<std::unique_ptr<GrammarConstraint>> rows;
  std::vector<size_t> at(static_cast<size_t>(batch), 0);
  auto restart = [&](int i) {
    rows[size_t(i)] = std::make_unique<GrammarConstraint>(g, 200);
    at[size_t(i)] = 0;
  };
  rows.resize(size_t(batch));
  for (int i = 0; i < batch; ++i) restart(i);
  int64_t words = 0;
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i) {
      const std::vector<int>& r = replies[size_t(i) % replies.size()];
      const auto mask = rows[size_t(i)]->allowed();
      words += int64_t(mask->size());
      rows[size_t(i)]->advance(r[at[size_t(i)]]);
      if (++at[size_t(i)] == r.size()) restart(i);
    }
  }
  benchmark::DoNotOptimize(words);
  state.counters["vocab"] = double(g->vocabulary().size());
  state.counters["dfa_states"] = double(g->states());
  state.counters["per_row_ns"] = benchmark::Counter(double(batch), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_GrammarMaskStep)->Arg(1)->Arg(64)->Unit(benchmark::kMicrosecond);

// A schema's first request: the grammar compiled and its reply's masks built as reached.
void BM_GrammarFirstRequest(benchmark::State& state) {
  const std::vector<int> tokens = [] {
    GrammarCache cache(vocabulary());
    return reply(cache.json_schema(nlohmann::ordered_json::parse(kSchema)), 1);
  }();
  for (auto _ : state) {
    GrammarCache cache(vocabulary());
    auto g = cache.json_schema(nlohmann::ordered_json::parse(kSchema));
    GrammarConstraint c(g, 200);
    for (int t : tokens) {
      benchmark::DoNotOptimize(c.allowed());
      c.advance(t);
    }
  }
  state.counters["tokens"] = double(tokens.size());
}
BENCHMARK(BM_GrammarFirstRequest)->Unit(benchmark::kMillisecond);

}  // namespace
