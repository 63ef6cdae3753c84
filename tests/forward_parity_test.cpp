// One parity suite for every executor (forward/executor.h): the network, run through the interface
// the engine drives, against DeepSeek's reference on the golden fixtures, at the harness's three
// levels (forward_fixture.h: exact, forced, free, and near-ties). tests/CMakeLists.txt registers
// the CPU executor's instances everywhere and the CUDA executor's, label gpu, where a GPU is.
//
// The CPU executor runs every check under each summation variant, its bound being at least their
// spread (forward_fixture.h, kVariants); the variants are the CPU's GEMM orders, so the CUDA
// executor runs once, in its own kernels' order, under the same baseline figures.
#include <cctype>
#include <optional>

#include "engine/executors.h"
#include "forward_fixture.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

// Executor ("cpu", "cpu_2ranks": the CPU executor over the model cut in two as model.py's
// world_size 2 cuts it, "cuda"), fixture.
using Param = std::tuple<std::string, std::string>;

class ForwardParity : public testing::TestWithParam<Param> {
 protected:
  std::string executor() const { return std::get<0>(GetParam()); }
  Device device() const { return parse_device(executor() == "cpu_2ranks" ? "cpu" : executor()); }
  int ranks() const { return executor() == "cpu_2ranks" ? 2 : 1; }
  bool cpu() const { return device() == Device::Cpu; }
  int variants() const { return cpu() ? kVariants : 1; }
  Fixture fixture() const {
    const Device d = device();
    const int n = ranks();
    return Fixture(std::get<1>(GetParam()),
                   executor_sequences([d, n](const Model& model) { return make_executor(model, d, std::nullopt, n); }));
  }
  // The ranks' cut sums are one more summation order of the whole model's: the bound is at least
  // the spread over both forwards' orders.
  std::optional<Fixture> orders_also() const {
    if (ranks() == 1) return std::nullopt;
    return Fixture(std::get<1>(GetParam()));
  }
};

// Exact: the 5-token prompt's prefill makes no near-tied choice, and the reference agrees with
// itself across devices there (baseline.json: 1e-6 on the fp8 fixtures, 0.052 on the bf16 one,
// whose CPU run multiplies in bf16). On v41-tiny no choice is near-tied in decode either: the whole
// run, and its greedy tokens, match.
TEST_P(ForwardParity, ShortPromptEndToEnd) {
  Fixture f = fixture();
  const int64_t V = f.config().vocab_size;
  std::vector<Logits> runs;
  std::vector<std::vector<float>> prefills, decodes;
  for (int v = 0; v < variants(); ++v) {
    VariantScope scope(v);
    runs.push_back(f.run(0, false));
    prefills.push_back(runs.back().prefill);
    decodes.push_back(runs.back().decode);
  }
  const LogitStats prefill_spread = spread(prefills, V), decode_spread = spread(decodes, V);
  std::printf("%s prompt0 spread over %d summation variants: prefill max %.2e, decode max %.2e\n", f.name.c_str(), variants(),
              prefill_spread.max, decode_spread.max);
  for (int v = 0; v < variants(); ++v) {
    expect_short_prompt_exact(f, runs[size_t(v)], f.name + " exact variant " + std::to_string(v), &prefill_spread);
    // The CPU forward's own claim on v41-tiny: its whole decode, logits too, is the reference's,
    // to fp32 rounding (1e-5: 10 fp32 ulps at the logits' magnitude of ~1), or to the variants'
    // spread if that is wider. (The reference's own CPU and CUDA runs part by more.)
    if (cpu() && f.name == "v41-tiny") {
      EXPECT_LE(compare_logits(runs[size_t(v)].decode, f.ex.floats("prompt0.decode.logits"), V).max,
                std::max(1e-5, kHeadroom * decode_spread.max))
          << "variant " << v;
    }
  }
}

// Forced: with the reference's top-k and experts imposed, each prompt within the baseline's
// forced_topk_routing figures (or the summation variants' spread, if wider).
TEST_P(ForwardParity, ForcedChoices) {
  Fixture f = fixture();
  std::optional<Fixture> whole = orders_also();
  for (int prompt = 0; prompt < 3; ++prompt)
    expect_mode(f, "forced_topk_routing", {prompt}, variants(), whole ? &*whole : nullptr);
}

// Free: our own choices, all prompts pooled (a single near-tie flip in 8 decode rows moves one
// prompt's figures arbitrarily; the near-tie test below accounts for every flip).
TEST_P(ForwardParity, FreeChoices) {
  Fixture f = fixture();
  std::optional<Fixture> whole = orders_also();
  expect_mode(f, "free", {0, 1, 2}, variants(), whole ? &*whole : nullptr);
}

// Under forcing, every forward call sees the reference's own inputs up to rounding noise; where our
// own pick still differs from the recorded one, the two must be nearly tied under our scores.
TEST_P(ForwardParity, OwnChoicesDifferOnlyAtNearTies) {
  Fixture f = fixture();
  for (int prompt = 0; prompt < 3; ++prompt) {
    std::vector<Trace> traces;
    f.run(prompt, true, 0, &traces);
    std::vector<int64_t> rows(traces.size(), 1);
    rows[0] = int64_t(f.tokens(prompt).size());
    ChoiceSource reference = [&](bool decode, int64_t first, int64_t n) { return f.recorded(prompt, decode, first, n); };
    expect_near_ties(f, choice_gaps(f.config(), traces, rows, reference), f.name + " prompt" + std::to_string(prompt));
  }
}

// Every executor on every fixture; the cut model on v41-tiny (fp8, Engram) and v41-tiny-bf16 (the
// bf16 products, where the cut's sums part from the whole model's): v41-tiny-noengram's layers are
// v41-tiny's without Engram, nothing a cut runs differently.
std::vector<Param> params() {
  std::vector<std::string> whole = {"cpu"};
#ifdef DSV41_HAVE_CUDA
  whole.push_back("cuda");
#endif
  std::vector<Param> p;
  for (const std::string& fixture : kFixtures) {
    for (const std::string& e : whole) p.emplace_back(e, fixture);
    if (fixture != "v41-tiny-noengram") p.emplace_back("cpu_2ranks", fixture);
  }
  return p;
}

std::string name(const testing::TestParamInfo<Param>& info) {
  std::string fixture = std::get<1>(info.param);
  for (char& ch : fixture)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return std::get<0>(info.param) + "_" + fixture;
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Executors, ForwardParity, testing::ValuesIn(params()), name);
