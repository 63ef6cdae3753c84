// The CPU forward's own claims on the golden fixtures, beyond the parity suite every executor
// passes (forward_parity_test.cpp).
#include "forward_fixture.h"

using namespace dsv41;
using namespace dsv41::test;

namespace {

class ForwardFixture : public testing::TestWithParam<std::string> {};

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
