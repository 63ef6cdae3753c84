#pragma once
// The whole-model checks' common ground (train_model_test.cpp, train_dspark_test.cpp): the `tiny`
// preset with or without Engram, a random sequence, parameters away from the initial point's
// structure, and a trace holding a forward's choices.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <random>
#include <vector>

#include "forward/forward.h"
#include "model/config.h"
#include "gradcheck.h"
#include "train/model/parameters.h"

namespace dsv41::test {

inline Config tiny(bool engram) {
  Config c = preset("tiny");
  if (!engram) {
    c.engram_layer_ids.clear();
    c.engram_num_embeddings.clear();
  }
  validate(c);
  return c;
}

// A sequence of `rows` inputs and their next tokens, and each input's Engram rows (any row of the
// layer's table: the hash that picks them is not part of the model).
struct Sequence {
  std::vector<int64_t> tokens, engram_ids;
};
inline Sequence make_sequence(const Config& c, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  Sequence s;
  for (int64_t r = 0; r <= rows; ++r) s.tokens.push_back(int64_t(rng() % uint32_t(c.vocab_size)));
  for (int64_t r = 0; r < rows; ++r)
    for (size_t e = 0; e < c.engram_layer_ids.size(); ++e)
      for (int j = 0; j < c.engram_hash_columns(); ++j) s.engram_ids.push_back(int64_t(rng() % uint64_t(c.engram_num_embeddings[e])));
  return s;
}

// The initialisation at a width where every op is non-linear on its inputs (matrices N(0, 0.1): unit
// pre-activations at dim 128), then every value moved by N(0, 0.1), so that no structure of the
// initial point (hc_fn = 0, unit norms, the identity-like comb) hides a term of a gradient.
template <class T>
train::Parameters<T> make_parameters(const Config& c) {
  train::Parameters<T> p(c);
  train::init_parameters(p, train::InitOptions{7, 0.1});
  std::mt19937 rng(11);
  std::normal_distribution<double> noise(0.0, 0.1);
  for (train::Param<T>& t : p.all())
    for (T& v : t.value) v += T(noise(rng));
  return p;
}

// A trace imposing the choices `recorded` made (its top-k and experts).
inline Trace hold(const Trace& recorded) {
  Trace t;
  t.forced_topk = &recorded.topk;
  t.forced_experts = &recorded.route_experts;
  return t;
}

inline double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

// Adds tensor t to the groups checked together: a layer's (or stage's) routed experts form one.
inline void add_to_groups(std::vector<std::vector<train::Param<double>*>>& groups, train::Param<double>& t) {
  const auto block = [](const std::string& name) { return name.substr(0, name.find(".ffn.")); };
  const bool routed = t.name.find(".ffn.experts.") != std::string::npos;
  if (routed && !groups.empty() && groups.back().front()->name.find(".ffn.experts.") != std::string::npos &&
      block(groups.back().front()->name) == block(t.name))
    groups.back().push_back(&t);
  else
    groups.push_back({&t});
}

// Each group of tensors along a random unit direction v over all its coordinates:
// (L(θ + h v) − L(θ − h v)) / 2h against g · v — every coordinate at once: a wrong term anywhere
// moves g · v by its share — with gradcheck.h's step and its tolerance in the directional form,
// 1e-6 (|g · v| + ‖g‖). `loss(name)` runs the forward and returns the objective that trains the
// group's first tensor. Returns the largest |fd − g · v| as a fraction of its tolerance.
inline double check_directions(const std::vector<std::vector<train::Param<double>*>>& groups,
                               const std::function<double(const std::string&)>& loss) {
  std::mt19937 rng(5);
  std::normal_distribution<double> normal;
  double worst = 0;
  for (const std::vector<train::Param<double>*>& group : groups) {
    const std::string& name = group.front()->name;
    std::vector<std::vector<double>> v, saved;
    double vv = 0, gv = 0, gg = 0;
    for (train::Param<double>* t : group) {
      v.emplace_back(t->value.size());
      for (double& x : v.back()) {
        x = normal(rng);
        vv += x * x;
      }
      saved.push_back(t->value);
    }
    for (size_t j = 0; j < group.size(); ++j)
      for (size_t i = 0; i < v[j].size(); ++i) {
        v[j][i] /= std::sqrt(vv);
        gv += group[j]->grad[i] * v[j][i];
        gg += group[j]->grad[i] * group[j]->grad[i];
      }
    auto loss_at = [&](double step) {
      for (size_t j = 0; j < group.size(); ++j)
        for (size_t i = 0; i < v[j].size(); ++i) group[j]->value[i] = saved[j][i] + step * v[j][i];
      return loss(name);
    };
    const double fd = (loss_at(kFdStep) - loss_at(-kFdStep)) / (2 * kFdStep);
    for (size_t j = 0; j < group.size(); ++j) group[j]->value = saved[j];
    const double tol = kFdTolerance * (std::fabs(gv) + std::sqrt(gg));
    EXPECT_NEAR(fd, gv, tol) << name << (group.size() > 1 ? " (with the block's other routed experts)" : "");
    worst = std::max(worst, std::fabs(fd - gv) / tol);
  }
  return worst;
}

}  // namespace dsv41::test
