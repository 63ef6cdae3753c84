// The CPU forward against DeepSeek's reference on the golden fixtures (tests/data/fixtures/*/README.md
// gives every tensor and the reference's call sequence).
#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "fixture.h"
#include "forward/forward.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

struct PromptRun {
  std::vector<float> prefill_logits, decode_logits;
};

// The reference's recorded choices for a forward call: index-source top-k and routed experts.
struct Forced {
  std::map<int, std::vector<std::vector<int64_t>>> topk;
  std::vector<std::vector<int32_t>> experts;
};

// Rows [first, first + rows) of the prefill dumps, or decode step `step` (rows = 1).
Forced recorded(const Config& c, const Expected& ex, const std::string& p, bool decode, int64_t first, int64_t rows) {
  Forced f;
  const int k = c.n_activated_experts, K = c.index_topk, L = c.n_layers;
  for (int l : c.index_source_layers) {
    std::vector<int64_t> t = ex.ints(p + (decode ? "decode" : "prefill") + ".layer" + std::to_string(l) + ".topk");
    auto& rowsv = f.topk[l];
    for (int64_t r = 0; r < rows; ++r) rowsv.emplace_back(t.begin() + (first + r) * K, t.begin() + (first + r + 1) * K);
  }
  std::vector<int64_t> e = ex.ints(p + (decode ? "decode" : "prefill") + ".route_experts");
  const int64_t P = decode ? 0 : int64_t(e.size()) / (L * k);
  f.experts.resize(size_t(L));
  for (int l = 0; l < L; ++l)
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < k; ++j)
        f.experts[l].push_back(int32_t(decode ? e[(first * L + l) * k + j] : e[(l * P + first + r) * k + j]));
  return f;
}

PromptRun run_prompt(const Model& model, const Expected& ex, int prompt, Trace* prefill_trace = nullptr,
                     bool force = false) {
  const Config& c = model.config();
  const std::string p = "prompt" + std::to_string(prompt) + ".";
  std::vector<int64_t> tokens64 = ex.ints(p + "tokens");
  std::vector<int> tokens(tokens64.begin(), tokens64.end());
  std::vector<int64_t> hashes = c.has_engram() ? ex.ints(p + "prefill.engram_hash") : std::vector<int64_t>{};
  SequenceState state(c);
  PromptRun run;
  ForwardOptions opt;
  opt.all_logits = true;
  Trace forced_trace;
  Forced f;
  opt.trace = prefill_trace ? prefill_trace : &forced_trace;
  if (force) {
    f = recorded(c, ex, p, false, 0, int64_t(tokens.size()));
    opt.trace->forced_topk = &f.topk;
    opt.trace->forced_experts = &f.experts;
  }
  run.prefill_logits = forward(model, state, tokens, c.has_engram() ? hashes.data() : nullptr, opt);

  std::vector<int64_t> decode = ex.ints(p + "decode.tokens");
  std::vector<int64_t> dhash = c.has_engram() ? ex.ints(p + "decode.engram_hash") : std::vector<int64_t>{};
  const int64_t per_step = int64_t(c.engram_layer_ids.size()) * c.engram_hash_columns();
  for (size_t k = 0; k < decode.size(); ++k) {
    int t = int(decode[k]);
    ForwardOptions dopt;
    Trace dtrace;
    if (force) {
      f = recorded(c, ex, p, true, int64_t(k), 1);
      dtrace.forced_topk = &f.topk;
      dtrace.forced_experts = &f.experts;
      dopt.trace = &dtrace;
    }
    std::vector<float> logits =
        forward(model, state, std::span<const int>(&t, 1), c.has_engram() ? dhash.data() + k * per_step : nullptr, dopt);
    run.decode_logits.insert(run.decode_logits.end(), logits.begin(), logits.end());
  }
  return run;
}

}  // namespace

TEST(ForwardFixture, Forced) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  Expected ex("v41-tiny");
  const int64_t V = model->config().vocab_size;
  for (int prompt = 0; prompt < 3; ++prompt) {
    PromptRun run = run_prompt(*model, ex, prompt, nullptr, true);
    const std::string p = "prompt" + std::to_string(prompt) + ".";
    LogitStats pre = compare_logits(run.prefill_logits, ex.floats(p + "prefill.logits"), V);
    LogitStats dec = compare_logits(run.decode_logits, ex.floats(p + "decode.logits"), V);
    std::printf("FORCED prompt%d prefill max %.6f mean %.6f p99 %.6f argmax %.3f | decode max %.6f mean %.6f argmax %.3f\n", prompt,
                pre.max, pre.mean, pre.p99, pre.argmax_agree, dec.max, dec.mean, dec.argmax_agree);
  }
}

TEST(ForwardFixture, Diagnostics) {
  auto model = Model::load(fixture_dir("v41-tiny"));
  Expected ex("v41-tiny");
  const int64_t V = model->config().vocab_size;
  for (int prompt = 0; prompt < 3; ++prompt) {
    Trace trace;
    PromptRun run = run_prompt(*model, ex, prompt, &trace);
    const std::string p = "prompt" + std::to_string(prompt) + ".";
    LogitStats pre = compare_logits(run.prefill_logits, ex.floats(p + "prefill.logits"), V);
    LogitStats dec = compare_logits(run.decode_logits, ex.floats(p + "decode.logits"), V);
    std::printf("prompt%d prefill max %.6f mean %.6f p99 %.6f argmax %.3f | decode max %.6f mean %.6f argmax %.3f\n", prompt,
                pre.max, pre.mean, pre.p99, pre.argmax_agree, dec.max, dec.mean, dec.argmax_agree);
    // per-layer block_out relative max diff on the dumped positions
    std::vector<int64_t> pos = ex.ints(p + "prefill.block_pos");
    std::vector<float> ref = ex.floats(p + "prefill.block_out");
    const int64_t hcd = int64_t(model->config().hc_mult) * model->config().dim, T = int64_t(pos.size());
    for (int l = 0; l < model->config().n_layers; ++l) {
      double maxd = 0, maxr = 0;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < hcd; ++j) {
          double a = trace.block_out[l][pos[i] * hcd + j], b = ref[(l * T + i) * hcd + j];
          maxd = std::max(maxd, std::fabs(a - b));
          maxr = std::max(maxr, std::fabs(b));
        }
      std::printf("  layer %d block_out maxdiff %.6f (rel %.6f)\n", l, maxd, maxd / maxr);
    }
  }
}
