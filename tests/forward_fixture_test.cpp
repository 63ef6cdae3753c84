// The CPU forward against DeepSeek's reference on the golden fixtures (the harness and its three
// levels: forward_fixture.h).
#include "forward_fixture.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

class ForwardFixture : public testing::TestWithParam<std::string> {};

// Exact: the 5-token prompt's prefill makes no near-tied choice, and the reference agrees with
// itself across devices there (baseline.json: 1e-6 on the fp8 fixtures, 0.052 on the bf16 one,
// whose CPU run multiplies in bf16). On v41-tiny no choice is near-tied in decode either: the whole
// run, and its greedy tokens, match. Each summation variant is held to it, the prefill bound being
// at least the variants' spread (forward_fixture.h, kVariants).
TEST_P(ForwardFixture, ShortPromptEndToEnd) {
  Fixture f(GetParam());
  const int64_t V = f.config().vocab_size;
  std::vector<Logits> runs;
  std::vector<std::vector<float>> prefills, decodes;
  for (int v = 0; v < kVariants; ++v) {
    VariantScope scope(v);
    runs.push_back(f.run(0, false));
    prefills.push_back(runs.back().prefill);
    decodes.push_back(runs.back().decode);
  }
  const LogitStats prefill_spread = spread(prefills, V), decode_spread = spread(decodes, V);
  std::printf("%s prompt0 spread over %d summation variants: prefill max %.2e, decode max %.2e\n", f.name.c_str(), kVariants,
              prefill_spread.max, decode_spread.max);
  for (int v = 0; v < kVariants; ++v) {
    expect_short_prompt_exact(f, runs[size_t(v)], f.name + " exact variant " + std::to_string(v), &prefill_spread);
    // The CPU forward's own claim on v41-tiny: its whole decode, logits too, is the reference's,
    // to fp32 rounding (1e-5: 10 fp32 ulps at the logits' magnitude of ~1), or to the variants'
    // spread if that is wider.
    if (f.name == "v41-tiny") {
      EXPECT_LE(compare_logits(runs[size_t(v)].decode, f.ex.floats("prompt0.decode.logits"), V).max,
                std::max(1e-5, kHeadroom * decode_spread.max))
          << "variant " << v;
    }
  }
}

// Forced: with the reference's top-k and experts imposed, each prompt within the baseline's
// forced_topk_routing figures (or the summation variants' spread, if wider), for every variant.
TEST_P(ForwardFixture, ForcedChoices) {
  Fixture f(GetParam());
  for (int prompt = 0; prompt < 3; ++prompt) expect_mode(f, "forced_topk_routing", {prompt}, kVariants);
}

// Free: our own choices, all prompts pooled (a single near-tie flip in 8 decode rows moves one
// prompt's figures arbitrarily; the near-tie test below accounts for every flip).
TEST_P(ForwardFixture, FreeChoices) {
  Fixture f(GetParam());
  expect_mode(f, "free", {0, 1, 2}, kVariants);
}

// Under forcing, every forward call sees the reference's own inputs up to rounding noise; where our
// own pick still differs from the recorded one, the two must be nearly tied under our scores.
TEST_P(ForwardFixture, OwnChoicesDifferOnlyAtNearTies) {
  Fixture f(GetParam());
  for (int prompt = 0; prompt < 3; ++prompt) {
    std::vector<Trace> traces;
    f.run(prompt, true, 0, &traces);
    std::vector<int64_t> rows(traces.size(), 1);
    rows[0] = int64_t(f.tokens(prompt).size());
    ChoiceSource reference = [&](bool decode, int64_t first, int64_t n) { return f.recorded(prompt, decode, first, n); };
    expect_near_ties(f, choice_gaps(f.config(), traces, rows, reference), f.name + " prompt" + std::to_string(prompt));
  }
}

// Chunked prefill (chunks of 1, 7 and 64 tokens, then the same decode steps) equals one-shot
// prefill to the bit, its choices too: every product's sum depends on its own row alone
// (backend/cpu/gemm.h), and a later chunk lists its window slots in the ring's order, which holds
// the same entries in the same order, its empty slots adding exact zeros (forward/window.h).
TEST_P(ForwardFixture, ChunkedPrefillEqualsOneShot) {
  Fixture f(GetParam());
  for (int prompt = 1; prompt < 3; ++prompt) {
    std::vector<Trace> whole_traces;
    const Logits whole = f.run(prompt, false, 0, &whole_traces);
    for (int64_t chunk : {1, 7, 64}) {
      std::vector<Trace> traces;
      const Logits pieces = f.run(prompt, false, chunk, &traces);
      const std::string what = f.name + " prompt" + std::to_string(prompt) + " chunks of " + std::to_string(chunk);
      EXPECT_EQ(pieces.prefill, whole.prefill) << what;
      EXPECT_EQ(pieces.decode, whole.decode) << what;
      // The choices: the prefill's row by row over its chunks, then each decode step's (the last
      // 8 calls of each run).
      const size_t chunks = traces.size() - 8;
      for (size_t l = 0; l < whole_traces[0].route_experts.size(); ++l) {
        std::vector<int32_t> experts;
        for (size_t i = 0; i < chunks; ++i)
          experts.insert(experts.end(), traces[i].route_experts[l].begin(), traces[i].route_experts[l].end());
        EXPECT_EQ(experts, whole_traces[0].route_experts[l]) << what << " layer " << l;
      }
      for (size_t k = 0; k < 8; ++k) {
        const Trace& a = traces[traces.size() - 8 + k];
        const Trace& b = whole_traces[whole_traces.size() - 8 + k];
        EXPECT_EQ(a.route_experts, b.route_experts) << what << " decode step " << k;
        EXPECT_EQ(a.topk, b.topk) << what << " decode step " << k;
      }
    }
  }
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Fixtures, ForwardFixture, testing::ValuesIn(test::kFixtures), test::FixtureName());
