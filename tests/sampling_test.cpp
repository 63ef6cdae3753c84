// The CPU's token choice (backend/cpu/sampling.h), the reference the device's is held to
// (tests/cuda/ops_sampling_test.cu).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/sampling.h"
#include "base/error.h"

using namespace dsv41;

namespace {

SampleRequest request(const std::vector<float>& logits, SamplingParams p, double u, int top = -1) {
  return SampleRequest{p, u, int64_t(logits.size()), top};
}

TEST(Sampling, GreedyIsTheFirstMaximum) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(choose(logits.data(), request(logits, {}, 0.9)).token, 1);
  Sampler greedy(SamplingParams{});
  EXPECT_EQ(greedy.draw(), 0.0);  // no draw when greedy
  EXPECT_EQ(greedy.sample(logits.data(), 4), 1);
}

// The walk: u in [0, 1) of the kept mass, candidates by descending logit, ties by the lower id.
TEST(Sampling, TheDrawWalksTheCandidatesInOrder) {
  const std::vector<float> logits = {0.0f, 1.0f, 1.0f, -30.0f};  // p ≈ 0.155, 0.422, 0.422, ~0
  SamplingParams p;
  p.temperature = 1;
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.0)).token, 1);
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.40)).token, 1);
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.44)).token, 2);
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.90)).token, 0);
  p.top_k = 1;  // only the first candidate
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.99)).token, 1);
  p.top_k = 0;
  p.top_p = 0.5f;  // the two tied candidates reach it: mass 0.845
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.99)).token, 2);
  p.top_p = 1;
  p.min_p = 0.5f;  // 0.155 < 0.5 × 0.422: token 0 out
  EXPECT_EQ(choose(logits.data(), request(logits, p, 0.99)).token, 2);
}

// Frequencies over 40,000 draws against the softmax at the temperature: each within 5 standard
// deviations of a binomial count (a correct sampler fails this about once in 10^6 runs; the seed
// is fixed, so it either always passes or never).
TEST(Sampling, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f};
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 1234;
  Sampler s(p);
  std::vector<double> want(4);
  double z = 0;
  for (size_t i = 0; i < 4; ++i) z += (want[i] = std::exp((logits[i] - 2.0) / 0.7));
  std::vector<int> count(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) count[size_t(s.sample(logits.data(), 4))] += 1;
  for (size_t i = 0; i < 4; ++i) {
    const double q = want[i] / z, sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(count[i], n * q, 5 * sd) << "token " << i;
  }
}

// A Sampler's draws are those of std::uniform_real_distribution over its stream (what a draw
// inside the choice made before draws were taken out of it): a seed gives the tokens it gave.
TEST(Sampling, DrawsAreTheStreamsUniformNumbers) {
  SamplingParams p;
  p.temperature = 1;
  p.seed = 99;
  Sampler s(p);
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.draw(), uniform(rng));
}

TEST(Sampling, LogprobsAreTheLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const TokenChoice c = choose(logits.data(), request(logits, {}, 0, 3));
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_EQ(c.token, 1);
  EXPECT_NEAR(c.logprob, 3.0 - std::log(z), 1e-6);
  ASSERT_EQ(c.top.size(), 3u);
  EXPECT_EQ(c.top[0].first, 1);
  EXPECT_EQ(c.top[1].first, 3);
  EXPECT_EQ(c.top[2].first, 2);
  EXPECT_NEAR(c.top[2].second, 2.0 - std::log(z), 1e-6);
  EXPECT_TRUE(choose(logits.data(), request(logits, {}, 0)).top.empty());
}

TEST(Sampling, ParametersOutOfRangeAreRefusedByName) {
  SamplingParams p;
  p.top_p = 0;
  try {
    Sampler s(p);
    FAIL() << "top_p 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("top_p"), std::string::npos) << e.what();
  }
}

}  // namespace
