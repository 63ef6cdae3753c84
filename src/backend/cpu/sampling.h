#pragma once
// Choosing the next token from logits on the CPU: greedy, or temperature sampling restricted by
// top-k, top-p and min-p (model/sampling.h). A Sampler owns its random stream, so the same seed and
// the same logits give the same tokens.
#include <cstdint>
#include <random>
#include <vector>

#include "model/sampling.h"

namespace dsv41 {

// What sampling (temperature > 0) draws from: the candidates by descending logit (ties: the lower
// id first), of which top-k, then min-p and top-p keep a prefix, with their probabilities (softmax
// at the temperature over the top-k), and the prefix's mass. Token ids[i] is drawn with
// probability p[i] / mass.
struct Candidates {
  std::vector<int> ids;
  std::vector<double> p;
  double mass = 0;
  // The candidate at the point u in [0, 1) of the mass (the last one where rounding leaves u past it).
  int at(double u) const;
  // The probability of token t (0 if it is not a candidate).
  double probability(int t) const;
};
Candidates candidates(const float* logits, const SamplingParams& params, int64_t vocab);

// Greedy: the first maximum. Sampling: the candidate at u (Candidates::at).
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
