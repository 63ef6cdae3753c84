// cuda::choose against the CPU's choose() (backend/cpu/sampling.h) on the same logits and draws.
//
// Tokens must be equal: both walk the same candidates in the same order (the device's sort is
// stable, ties by the lower id as the CPU's comparator) with the same filters; only the fp64 sums
// of the probabilities run in another order, which moves a boundary between two candidates by
// ~vocab × 2^-53 of the mass, and a draw lands that close to one with probability ~10^-11 per
// case here. Logprobs: the same float logits less a log-normaliser whose fp64 sum differs in the
// last bits; the normaliser's and the difference's float roundings can each move a result by one
// ulp, at most 3.8e-6 below magnitude 64 (these logprobs stay within ±60): within 1e-5. Logit
// edits (logit_bias, penalties) are the same fp32 steps on both: the edited rows are equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "backend/cpu/sampling.h"
#include "backend/cuda/sampling.h"
#include "base/error.h"
#include "device_util.h"

namespace dsv41 {
namespace {

using namespace dsv41::test;

struct Case {
  SamplingParams params;
  int top_logprobs;
};

SamplingParams params(float temperature, int top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = temperature, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
  return p;
}

TEST(CudaSampling, ChoosesWhatTheCpuChooses) {
  DSV41_REQUIRE_DEVICE();
  std::mt19937_64 rng(7);
  const std::vector<Case> cases = {
      {params(0.0f, 0, 1.0f, 0.0f), -1},    // greedy: the argmax path
      {params(0.0f, 0, 1.0f, 0.0f), 5},     // greedy with logprobs: the sorted path
      {params(1.0f, 0, 1.0f, 0.0f), -1},    // the whole vocabulary
      {params(0.7f, 40, 1.0f, 0.0f), 3},    // top-k
      {params(1.3f, 0, 0.9f, 0.0f), -1},    // top-p
      {params(1.0f, 0, 1.0f, 0.05f), 20},   // min-p
      {params(0.6f, 100, 0.95f, 0.01f), 1}  // all three
  };
  for (const int64_t vocab : {int64_t(50), int64_t(129280)}) {
    const int64_t stride = vocab + 3;  // rows apart by more than the sampled ids, as a tokenizer's smaller vocabulary
    const int rows = 24;
    std::vector<float> logits(size_t(rows * stride));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : logits) x = normal(rng);
    // Ties: a few rows with repeated values (the lower id first on both).
    for (int r = 0; r < rows; r += 5)
      for (int64_t i = 0; i < vocab; ++i) logits[size_t(r * stride + i)] = float(int(logits[size_t(r * stride + i)]));
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    for (const Case& c : cases)
    for (const bool edit : {false, true}) {
      DeviceArray<float> device(logits);  // (the edits change the device's rows in place)
      std::vector<int64_t> row_of;
      std::vector<SampleRequest> requests;
      for (int r = rows - 1; r >= 0; --r) {  // out of order, as a batch's sampled rows may be
        row_of.push_back(r);
        requests.push_back(SampleRequest{c.params, uniform(rng), vocab, c.top_logprobs, {}, nullptr});
        if (!edit) continue;
        // Logit edits on a row's first tokens and its best one: biases, repetition penalties,
        // subtractions (a penalized reply), every sign.
        const float* row = logits.data() + r * stride;
        const int best = int(std::max_element(row, row + vocab) - row);
        std::uniform_real_distribution<float> bias(-3.0f, 3.0f), rep(0.5f, 2.0f), sub(-1.0f, 2.0f);
        for (int t = 0; t < 8; ++t) requests.back().edits.push_back(LogitEdit{t, bias(rng), rep(rng), sub(rng)});
        if (best >= 8) requests.back().edits.push_back(LogitEdit{best, -1.5f, 1.25f, 0.5f});
      }
      const std::vector<TokenChoice> got = cuda::choose(device.get(), stride, row_of, requests, nullptr);
      ASSERT_EQ(got.size(), requests.size());
      for (size_t i = 0; i < requests.size(); ++i) {
        const TokenChoice want = choose(logits.data() + row_of[i] * stride, requests[i]);
        const std::string what = std::string(edit ? "edited, " : "") + "vocab " + std::to_string(vocab) + " T " + std::to_string(c.params.temperature) + " k " +
                                 std::to_string(c.params.top_k) + " p " + std::to_string(c.params.top_p) + " min_p " +
                                 std::to_string(c.params.min_p) + " row " + std::to_string(row_of[i]);
        EXPECT_EQ(got[i].token, want.token) << what;
        if (c.top_logprobs < 0) continue;
        EXPECT_NEAR(got[i].logprob, want.logprob, 1e-5) << what;
        ASSERT_EQ(got[i].top.size(), want.top.size()) << what;
        for (size_t j = 0; j < want.top.size(); ++j) {
          EXPECT_EQ(got[i].top[j].first, want.top[j].first) << what << " top " << j;
          EXPECT_NEAR(got[i].top[j].second, want.top[j].second, 1e-5) << what << " top " << j;
        }
      }
    }
  }
}

TEST(CudaSampling, RefusesWhatItCannotTake) {
  DSV41_REQUIRE_DEVICE();
  DeviceArray<float> device(std::vector<float>(8, 0.0f));
  const std::vector<int64_t> row = {0};
  EXPECT_THROW(cuda::choose(device.get(), 8, row, std::vector<SampleRequest>{SampleRequest{{}, 0, 9, -1, {}, nullptr}}, nullptr), Error);
  EXPECT_THROW(cuda::choose(device.get(), 8, row, std::vector<SampleRequest>{SampleRequest{{}, 0, 8, 21, {}, nullptr}}, nullptr), Error);
  EXPECT_THROW(cuda::choose(device.get(), 8, row, std::vector<SampleRequest>{SampleRequest{{}, 0, 8, -1, {{3}, {3}}, nullptr}}, nullptr), Error);
  EXPECT_THROW(cuda::choose(device.get(), 8, row, std::vector<SampleRequest>{SampleRequest{{}, 0, 8, -1, {{8}}, nullptr}}, nullptr), Error);
}


// A grammar's token mask on the device: the same choice and logprobs as the CPU's (disallowed
// logits at -inf after the edits), never a disallowed token.
TEST(CudaSampling, MaskedRowsChooseAsTheCpu) {
  DSV41_REQUIRE_DEVICE();
  std::mt19937 rng(9);
  for (const int64_t vocab : {int64_t(50), int64_t(129280)}) {
    const int64_t stride = vocab + 3;
    const int rows = 6;
    std::vector<float> logits(size_t(rows * stride));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    for (float& x : logits) x = normal(rng);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::vector<int64_t> row_of;
    std::vector<SampleRequest> requests;
    for (int r = 0; r < rows; ++r) {
      auto mask = std::make_shared<TokenMask>(size_t((vocab + 31) / 32), 0u);
      if (r == 0) (*mask)[0] = 1u << 17;  // one token only
      else
        for (int64_t t = r; t < vocab; t += 3 + r) (*mask)[size_t(t) / 32] |= 1u << (t % 32);
      SamplingParams p;
      p.temperature = r % 2 ? 0.8f : 0.0f;
      row_of.push_back(r);
      requests.push_back(SampleRequest{p, uniform(rng), vocab, r % 3 == 0 ? -1 : 5, {}, r == 2 ? nullptr : mask});
    }
    DeviceArray<float> device(logits);
    const std::vector<TokenChoice> got = cuda::choose(device.get(), stride, row_of, requests, nullptr);
    for (size_t i = 0; i < requests.size(); ++i) {
      const TokenChoice want = choose(logits.data() + row_of[i] * stride, requests[i]);
      EXPECT_EQ(got[i].token, want.token) << "row " << i;
      if (requests[i].allowed) {
        EXPECT_TRUE(allows(*requests[i].allowed, got[i].token)) << "row " << i;
      }
      ASSERT_EQ(got[i].top.size(), want.top.size()) << "row " << i;
      for (size_t j = 0; j < want.top.size(); ++j) EXPECT_EQ(got[i].top[j].first, want.top[j].first) << "row " << i;
    }
  }
}

}  // namespace
}  // namespace dsv41
