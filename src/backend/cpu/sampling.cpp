#include "backend/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"

namespace dsv41 {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  if (!(params.temperature >= 0)) fail("sampling", "temperature >= 0", std::to_string(params.temperature));
  if (params.top_k < 0) fail("sampling", "top_k >= 0", std::to_string(params.top_k));
  if (!(params.top_p > 0 && params.top_p <= 1)) fail("sampling", "top_p in (0, 1]", std::to_string(params.top_p));
  if (!(params.min_p >= 0 && params.min_p <= 1)) fail("sampling", "min_p in [0, 1]", std::to_string(params.min_p));
}

int Sampler::sample(const float* logits, int64_t vocab) {
  const int64_t best = std::max_element(logits, logits + vocab) - logits;
  if (params_.temperature == 0) return int(best);

  // Candidates by descending logit; each filter keeps a prefix of this order.
  std::vector<int> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  int64_t keep = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += (p[i] = std::exp(double(logits[order[i]] - logits[best]) / params_.temperature));
  for (double& x : p) x /= sum;
  int64_t n = 0;
  double mass = 0;
  while (n < keep && (n == 0 || (mass < params_.top_p && p[n] >= params_.min_p * p[0]))) mass += p[n++];

  std::uniform_real_distribution<double> uniform(0.0, mass);
  double u = uniform(rng_);
  for (int64_t i = 0; i < n; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[n - 1];
}

}  // namespace dsv41
