#pragma once
// Choosing the next token from logits: greedy, or temperature sampling restricted by top-k, top-p
// and min-p (DESIGN §3). A Sampler owns its random stream, so the same seed and the same logits
// give the same tokens.
#include <cstdint>
#include <random>

namespace dsv41 {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: no limit
  float top_p = 1.0f;        // nucleus: the smallest set of tokens whose probability reaches top_p
  float min_p = 0.0f;        // drop tokens below min_p × the most likely token's probability
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int sample(const float* logits, int64_t vocab);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace dsv41
