#pragma once
// Choosing a token from a row of logits (DESIGN §3), in the terms both backends take: the
// parameters, one row's draw, and what it gives back. The CPU's choice (backend/cpu/sampling.h) is
// the reference; CUDA's (backend/cuda/sampling.h) makes the same choice on the device, so that a
// step copies back tokens, not vocabulary-wide rows.
#include <cstdint>
#include <utility>
#include <vector>

namespace dsv41 {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // nucleus: the smallest set of tokens whose probability reaches top_p
  float min_p = 0.0f;        // drop tokens below min_p × the most likely token's probability
  uint64_t seed = 0;
};

// The most alternatives a choice reports (the OpenAI API's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

// One row's choice: the token among the row's first `vocab` logits under `params`, at the point
// u in [0, 1) of the kept candidates' probability mass (a Sampler's draw; unused when greedy), and
// the logprobs of the chosen token and of the top_logprobs most likely (-1: none).
struct SampleRequest {
  SamplingParams params;
  double u = 0;
  int64_t vocab = 0;
  int top_logprobs = -1;
};

struct TokenChoice {
  int token = 0;
  float logprob = 0;                       // log-softmax of the logits (before sampling)
  std::vector<std::pair<int, float>> top;  // the top_logprobs most likely, best first
};

}  // namespace dsv41
