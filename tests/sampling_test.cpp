// The CPU's token choice (backend/cpu/sampling.h), the reference the device's is held to
// (tests/cuda/ops_sampling_test.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/sampling.h"
#include "base/error.h"

using namespace dsv41;

namespace {

SampleRequest request(const std::vector<float>& logits, SamplingParams p, double u, int top = -1) {
  return SampleRequest{p, u, int64_t(logits.size()), top, {}, nullptr};
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

// The edits (model/sampling.h LogitEdit): l' = rep(l + bias) − subtract, the row's logprobs and
// choice taken after them. Values chosen so that every step is exact in fp32.
TEST(Sampling, LogitEditsChangeTheRowAsSpecified) {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 2.0f, 0.5f};
  SampleRequest r = request(logits, {}, 0, 5);
  r.edits = {{0, 1.0f, 2.0f, 0.0f},    // (1 + 1) / 2 = 1
             {1, 0.0f, 1.0f, 2.5f},    // 3 − 2.5 = 0.5
             {2, 0.0f, 2.0f, 0.25f},   // −2 · 2 − 0.25 = −4.25
             {3, -1.0f, 4.0f, 0.0f}};  // (2 − 1) / 4 = 0.25
  const std::vector<double> want = {1.0, 0.5, -4.25, 0.25, 0.5};
  double z = 0;
  for (double l : want) z += std::exp(l);
  const TokenChoice c = choose(logits.data(), r);
  EXPECT_EQ(c.token, 0);  // the first maximum after the edits (3 was before)
  EXPECT_NEAR(c.logprob, 1.0 - std::log(z), 1e-6);
  ASSERT_EQ(c.top.size(), 5u);
  for (const auto& [id, lp] : c.top) EXPECT_NEAR(lp, want[size_t(id)] - std::log(z), 1e-6) << "token " << id;
  EXPECT_EQ(c.top[1].first, 1);  // 0.5 ties 0.5: the lower id first
  EXPECT_EQ(c.top[2].first, 4);
  // Edits of tokens out of range, out of order or twice are refused, naming the edit.
  for (std::vector<LogitEdit> bad : {std::vector<LogitEdit>{{5}}, {{-1}}, {{2}, {1}}, {{1}, {1}}}) {
    r.edits = bad;
    EXPECT_THROW(choose(logits.data(), r), Error);
  }
}

// A Sampler's edits: logit_bias from the start; after start_reply(prompt) the repetition penalty
// on the prompt's tokens; each chosen token then the repetition penalty and presence + frequency ×
// its count; a new reply drops the last one's counts.
TEST(Sampling, PenaltiesCountThePromptAndTheReply) {
  SamplingParams p;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{3, -100.0f}, {9, 4.0f}};
  Sampler s(p, 10);
  s.start_reply(std::vector<int>{1, 2, 1});
  for (int t : {2, 2, 4}) s.chose(t);
  auto expect = [](const std::vector<LogitEdit>& got, const std::vector<LogitEdit>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].token, want[i].token) << i;
      EXPECT_EQ(got[i].bias, want[i].bias) << "token " << want[i].token;
      EXPECT_EQ(got[i].repetition, want[i].repetition) << "token " << want[i].token;
      EXPECT_EQ(got[i].subtract, want[i].subtract) << "token " << want[i].token;
    }
  };
  expect(s.edits(), {{1, 0, 2, 0}, {2, 0, 2, 1.0f}, {3, -100, 1, 0}, {4, 0, 2, 0.75f}, {9, 4, 1, 0}});
  s.start_reply(std::vector<int>{4});
  expect(s.edits(), {{3, -100, 1, 0}, {4, 0, 2, 0}, {9, 4, 1, 0}});
  // Nothing to edit: no edits, and none recorded.
  Sampler plain(SamplingParams{}, 10);
  plain.start_reply(std::vector<int>{1, 2});
  plain.chose(3);
  EXPECT_TRUE(plain.edits().empty());
  // Out of range: named.
  SamplingParams zero, outside, nan;
  zero.repetition_penalty = 0;
  outside.logit_bias = {{10, 1.0f}};
  nan.presence_penalty = NAN;
  for (const SamplingParams& q : {zero, outside, nan}) EXPECT_THROW(Sampler(q, 10), Error);
}

// Through a Sampler: a logit_bias of +100 makes a token the greedy choice, −100 bans the best one,
// and sampling draws from the softmax of the edited row (frequencies over 40,000 draws within 5
// standard deviations of the binomial counts, as above).
TEST(Sampling, BiasedAndPenalizedDrawsFollowTheEditedSoftmax) {
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f};
  SamplingParams greedy;
  greedy.logit_bias = {{2, 100.0f}};
  EXPECT_EQ(Sampler(greedy, 4).sample(logits.data(), 4), 2);
  greedy.logit_bias = {{3, -100.0f}};
  EXPECT_EQ(Sampler(greedy, 4).sample(logits.data(), 4), 0);

  SamplingParams p;
  p.temperature = 1;
  p.seed = 77;
  p.frequency_penalty = 1.0f;
  p.logit_bias = {{1, 0.5f}};
  Sampler s(p, 4);
  s.start_reply({});
  s.chose(3);  // token 3: 2 − 1 = 1
  const std::vector<double> edited = {1.0, 0.5, -0.5, 1.0};
  double z = 0;
  for (double l : edited) z += std::exp(l);
  std::vector<int> count(4, 0);
  const int n = 40000;
  for (int i = 0; i < n; ++i) count[size_t(choose(logits.data(), s.request(4)).token)] += 1;  // the counts stay as they are
  for (size_t i = 0; i < 4; ++i) {
    const double q = std::exp(edited[i]) / z, sd = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(count[i], n * q, 5 * sd) << "token " << i;
  }
}

}  // namespace

// A token mask (a grammar's): the disallowed tokens are never chosen, greedy or sampled, and are
// no alternatives; the allowed ones keep their logprobs of the unmasked row's log-softmax over
// the allowed tokens.
TEST(Sampling, MaskedTokensAreNeverChosen) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> logits(100);
  for (float& x : logits) x = normal(rng);
  auto mask = std::make_shared<TokenMask>(4, 0u);
  for (int t = 3; t < 100; t += 7) (*mask)[size_t(t) / 32] |= 1u << (t % 32);
  int best = 3;
  for (int t = 3; t < 100; t += 7)
    if (logits[size_t(t)] > logits[size_t(best)]) best = t;
  SampleRequest greedy = request(logits, SamplingParams{}, 0, 20);
  greedy.allowed = mask;
  const TokenChoice g = choose(logits.data(), greedy);
  EXPECT_EQ(g.token, best);
  EXPECT_EQ(g.top.size(), 14u);  // the 14 allowed tokens only
  for (const auto& [t, lp] : g.top) EXPECT_TRUE(allows(*mask, t)) << t;
  for (int k = 0; k < 200; ++k) {
    SampleRequest r = request(logits, SamplingParams{2.0f, 0, 1.0f, 0.0f, 0, {}, 1.0f, 0.0f, 0.0f}, std::uniform_real_distribution<double>(0, 1)(rng));
    r.allowed = mask;
    EXPECT_TRUE(allows(*mask, choose(logits.data(), r).token));
  }
  SampleRequest none = greedy;
  none.allowed = std::make_shared<TokenMask>(4, 0u);
  EXPECT_THROW(choose(logits.data(), none), Error);
}
