#pragma once
// Choosing the next token from logits on the CPU: greedy, or temperature sampling restricted by
// top-k, top-p and min-p (model/sampling.h). A Sampler owns its random stream, so the same seed and
// the same logits give the same tokens.
#include <cstdint>
#include <random>

#include "model/sampling.h"

namespace dsv41 {

// The candidates by descending logit (ties: the lower id first); top-k, then min-p and top-p keep
// a prefix of them, whose probabilities (softmax at the temperature) are walked to u × their mass.
TokenChoice choose(const float* logits, const SampleRequest& request);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // refuses parameters out of range, naming them
  const SamplingParams& params() const { return params_; }
  // The next row's point in [0, 1): a draw from the stream when sampling, 0 (no draw) when greedy.
  double draw();
  int sample(const float* logits, int64_t vocab) { return choose(logits, SampleRequest{params_, draw(), vocab}).token; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace dsv41
