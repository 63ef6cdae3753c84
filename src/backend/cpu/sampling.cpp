#include "backend/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"

namespace dsv41 {

Sampler::Sampler(const SamplingParams& params, int64_t vocab) : params_(params), rng_(params.seed) {
  if (!(params.temperature >= 0)) fail("sampling", "temperature >= 0", std::to_string(params.temperature));
  if (params.top_k < 0) fail("sampling", "top_k >= 0", std::to_string(params.top_k));
  if (!(params.top_p > 0 && params.top_p <= 1)) fail("sampling", "top_p in (0, 1]", std::to_string(params.top_p));
  if (!(params.min_p >= 0 && params.min_p <= 1)) fail("sampling", "min_p in [0, 1]", std::to_string(params.min_p));
  if (!(params.repetition_penalty > 0 && std::isfinite(params.repetition_penalty)))
    fail("sampling", "a finite repetition_penalty > 0", std::to_string(params.repetition_penalty));
  for (float p : {params.presence_penalty, params.frequency_penalty})
    if (!std::isfinite(p)) fail("sampling", "finite presence and frequency penalties", std::to_string(p));
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || (vocab > 0 && token >= vocab))
      fail("sampling", "logit_bias token ids in [0, " + std::to_string(vocab) + ")", std::to_string(token));
    if (!std::isfinite(bias)) fail("sampling", "a finite logit_bias for token " + std::to_string(token), std::to_string(bias));
  }
  start_reply({});
}

LogitEdit& Sampler::edit(int token) {
  auto [it, fresh] = edits_.try_emplace(token);
  if (fresh) it->second.token = token;
  return it->second;
}

void Sampler::start_reply(std::span<const int> prompt) {
  edits_.clear();
  counts_.clear();
  for (const auto& [token, bias] : params_.logit_bias) edit(token).bias += bias;
  if (params_.repetition_penalty == 1.0f) return;
  for (int t : prompt) edit(t).repetition = params_.repetition_penalty;
}

void Sampler::chose(int token) {
  if (constraint_) constraint_->advance(token);
  if (!params_.edits_logits()) return;
  const int n = ++counts_[token];
  LogitEdit& e = edit(token);
  e.repetition = params_.repetition_penalty;
  e.subtract = params_.presence_penalty + params_.frequency_penalty * float(n);
}

std::vector<LogitEdit> Sampler::edits() const {
  std::vector<LogitEdit> out;
  out.reserve(edits_.size());
  for (const auto& [token, e] : edits_) out.push_back(e);
  return out;
}

SampleRequest Sampler::request(int64_t vocab, int top_logprobs) {
  return SampleRequest{params_, draw(), vocab, top_logprobs, edits(), constraint_ ? constraint_->allowed() : nullptr};
}

int Sampler::sample(const float* logits, int64_t vocab) {
  const int token = choose(logits, request(vocab)).token;
  chose(token);
  return token;
}

// (What std::uniform_real_distribution<double>(0, mass) scales by mass: the stream's tokens are
// the ones a draw inside the choice gave.)
double Sampler::draw() {
  return params_.temperature == 0 ? 0.0 : std::generate_canonical<double, std::numeric_limits<double>::digits>(rng_);
}

static bool before(const float* logits, int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); }

Candidates candidates(const float* logits, const SamplingParams& params, int64_t vocab) {
  const int64_t best = std::max_element(logits, logits + vocab) - logits;
  Candidates c;
  std::vector<int> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = params.top_k > 0 ? std::min<int64_t>(params.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int a, int b) { return before(logits, a, b); });
  std::vector<double> p(static_cast<size_t>(keep));
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += (p[i] = std::exp(double(logits[order[i]] - logits[best]) / params.temperature));
  for (double& x : p) x /= sum;
  int64_t n = 0;
  // (A candidate of probability 0 — a masked token's — is never kept: a rounding walk past the
  // mass must not land on it.)
  while (n < keep && (n == 0 || (c.mass < params.top_p && p[n] >= params.min_p * p[0] && p[n] > 0))) c.mass += p[n++];
  c.ids.assign(order.begin(), order.begin() + n);
  c.p.assign(p.begin(), p.begin() + n);
  return c;
}

int Candidates::at(double u) const {
  u *= mass;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (u < p[i]) return ids[i];
    u -= p[i];
  }
  return ids.back();
}

double Candidates::probability(int t) const {
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] == t) return p[i] / mass;
  return 0;
}

TokenChoice choose(const float* row, const SampleRequest& r) {
  const int64_t vocab = r.vocab;
  std::vector<float> copy;
  const float* logits = row;
  if (!r.edits.empty() || r.allowed) {
    check_edits(r.edits, vocab);
    copy.assign(row, row + vocab);
    for (const LogitEdit& e : r.edits) copy[size_t(e.token)] = edited(copy[size_t(e.token)], e);
    if (r.allowed) {
      check_mask(*r.allowed, vocab);
      for (int64_t t = 0; t < vocab; ++t)
        if (!allows(*r.allowed, int(t))) copy[size_t(t)] = -std::numeric_limits<float>::infinity();
    }
    logits = copy.data();
  }
  const int64_t best = std::max_element(logits, logits + vocab) - logits;
  const int token = r.params.temperature > 0 ? candidates(logits, r.params, vocab).at(r.u) : int(best);
  if (r.top_logprobs < 0) return TokenChoice{token, 0, {}};
  return score(logits, vocab, token, r.top_logprobs);
}

TokenChoice score(const float* logits, int64_t vocab, int token, int top) {
  TokenChoice c;
  c.token = token;
  const int64_t best = std::max_element(logits, logits + vocab) - logits;
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i] - logits[best]));
  const float log_z = logits[best] + float(std::log(sum));
  c.logprob = logits[token] - log_z;
  std::vector<int> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  const int64_t k = std::min<int64_t>(vocab, top);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int a, int b) { return before(logits, a, b); });
  for (int64_t i = 0; i < k; ++i)
    if (std::isfinite(logits[ids[size_t(i)]])) c.top.emplace_back(ids[size_t(i)], logits[ids[size_t(i)]] - log_z);
  return c;
}

}  // namespace dsv41
