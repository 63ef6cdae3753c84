#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/linear.h"
#include "base/error.h"
#include "numerics/types.h"

namespace dsv41 {

namespace {

float score_of(float logit, const std::string& func) {
  if (func == "sigmoid") return 1.0f / (1.0f + std::exp(-logit));
  // softplus with torch's threshold: above 20 it is the identity in fp32
  float softplus = logit > 20.0f ? logit : std::log1p(std::exp(logit));
  return std::sqrt(softplus);
}

}  // namespace

void route(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
           int32_t* experts, float* weights, float* biased_out, const int32_t* forced, const Weight* bias_vl,
           const uint8_t* image_rows) {
  const int64_t E = gate.rows;
  const int k = opt.topk;
  if (opt.score_func == "softmax") fail("route", "score_func sqrtsoftplus or sigmoid", "softmax (not a V4.1 gate)");
  if (image_rows && !bias_vl) fail("route", "a gate.bias_vl for rows of an image span", "none (a checkpoint without vision)");
  std::vector<float> logits(size_t(rows * E)), b(static_cast<size_t>(E)), b_vl;
  linear_f32(x, rows, gate, logits.data());
  bias.row(0, b.data());
  if (image_rows) {
    b_vl.resize(static_cast<size_t>(E));
    bias_vl->row(0, b_vl.data());
  }
  std::vector<int> order(static_cast<size_t>(E));
  std::vector<float> scores(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float>& row_bias = image_rows && image_rows[r] ? b_vl : b;
    for (int64_t e = 0; e < E; ++e) {
      scores[e] = score_of(logits[r * E + e] / opt.gate_temp, opt.score_func);
      biased[e] = scores[e] + row_bias[e];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int a, int c) { return biased[a] > biased[c] || (biased[a] == biased[c] && a < c); });
    if (biased_out) std::copy(biased.begin(), biased.end(), biased_out + r * E);
    if (forced) std::copy_n(forced + r * k, k, order.begin());
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += scores[order[j]];
    for (int j = 0; j < k; ++j) {
      experts[r * k + j] = order[j];
      float w = scores[order[j]];
      if (opt.norm_topk_prob && k > 1) w /= sum + 1e-20f;  // not norm_eps: as in training
      weights[r * k + j] = w * opt.route_scale;
    }
  }
}

void expert_ffn(const float* x, int64_t rows, const Weight& w1, const Weight& w2, const Weight& w3, float limit,
                const float* row_weights, float* y) {
  const int64_t inter = w1.rows;
  std::vector<float> gate(size_t(rows * inter)), up(size_t(rows * inter));
  linear(x, rows, w1, gate.data());
  linear(x, rows, w3, up.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      float g = gate[r * inter + i], u = up[r * inter + i];
      if (limit > 0) {
        u = std::clamp(u, -limit, limit);
        g = std::min(g, limit);
      }
      float h = g / (1.0f + std::exp(-g)) * u;
      if (row_weights) h = row_weights[r] * h;
      gate[r * inter + i] = round_bf16(h);
    }
  linear(gate.data(), rows, w2, y);
}

}  // namespace dsv41
