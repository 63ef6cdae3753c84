#pragma once
// Choosing a token from a row of logits (DESIGN §3), in the terms both backends take: the
// parameters, one row's draw, and what it gives back. The CPU's choice (backend/cpu/sampling.h) is
// the reference; CUDA's (backend/cuda/sampling.h) makes the same choice on the device, so that a
// step copies back tokens, not vocabulary-wide rows.
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "numerics/types.h"

namespace dsv41 {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // nucleus: the smallest set of tokens whose probability reaches top_p
  float min_p = 0.0f;        // drop tokens below min_p × the most likely token's probability
  uint64_t seed = 0;
  // Before the choice, in this order (as vLLM's): logit_bias added to its tokens' logits; the
  // repetition penalty on every token of the prompt and of the reply so far (a positive logit
  // divided by it, a negative one multiplied: 1 = off); the presence penalty subtracted from every
  // token of the reply so far, and the frequency penalty times its count (OpenAI's).
  std::vector<std::pair<int, float>> logit_bias;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  bool edits_logits() const {
    return !logit_bias.empty() || repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// One token's logit changed before the choice: l' = rep(l + bias) − subtract, where rep(x) =
// x / repetition for x > 0 and x · repetition otherwise (fp32, in that order, on both backends).
struct LogitEdit {
  int token = 0;
  float bias = 0;
  float repetition = 1;
  float subtract = 0;
};

// The edited logit, as both backends compute it (the CUDA kernel calls this one).
DSV41_HD inline float edited(float logit, const LogitEdit& e) {
  float x = logit + e.bias;
  x = x > 0 ? x / e.repetition : x * e.repetition;
  return x - e.subtract;
}

// Refuses edits that are not of tokens in [0, vocab), ascending (each token at most once).
void check_edits(std::span<const LogitEdit> edits, int64_t vocab);

// The tokens a row may choose: bit t % 32 of word t / 32 is set when token t is allowed (a dense
// mask of the vocabulary, as the CUDA kernel reads it).
using TokenMask = std::vector<uint32_t>;
inline bool allows(const TokenMask& mask, int token) { return (mask[size_t(token) / 32] >> (token % 32)) & 1u; }

// Refuses a mask that does not cover [0, vocab) or allows no token.
void check_mask(const TokenMask& mask, int64_t vocab);

// A per-request restriction of the tokens (a grammar: engine/grammar/grammar.h), consulted
// before each choice and told each token chosen.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // The tokens allowed next; null when any token may come.
  virtual std::shared_ptr<const TokenMask> allowed() = 0;
  virtual void advance(int token) = 0;
  // Whether what was chosen so far is complete (the end token is allowed now).
  virtual bool complete() const = 0;
};

// The most alternatives a choice reports (the OpenAI API's top_logprobs limit).
inline constexpr int kMaxTopLogprobs = 20;

// One row's choice: the token among the row's first `vocab` logits under `params`, at the point
// u in [0, 1) of the kept candidates' probability mass (a Sampler's draw; unused when greedy), and
// the logprobs of the chosen token and of the top_logprobs most likely (-1: none), all of the
// row as its edits left it. A mask's disallowed tokens count as logits of -inf, after the edits:
// never chosen, absent from the top logprobs.
struct SampleRequest {
  SamplingParams params;
  double u = 0;
  int64_t vocab = 0;
  int top_logprobs = -1;
  std::vector<LogitEdit> edits;  // applied to the row first: tokens in [0, vocab), ascending (Sampler::edits)
  std::shared_ptr<const TokenMask> allowed;  // null: every token (Sampler::request, from its constraint)
};

struct TokenChoice {
  int token = 0;
  float logprob = 0;                       // log-softmax of the logits (before sampling)
  std::vector<std::pair<int, float>> top;  // the top_logprobs most likely, best first
};

}  // namespace dsv41
