#include "train/optim/expert_bias.h"

#include <string>

#include "base/error.h"

namespace dsv41::optim {

std::vector<int64_t> expert_loads(const int32_t* experts, int64_t rows, int topk, int64_t n_experts) {
  std::vector<int64_t> loads(size_t(n_experts), 0);
  for (int64_t k = 0; k < rows * topk; ++k) {
    const int32_t e = experts[k];
    if (e < 0 || e >= n_experts)
      fail("expert_loads", "expert ids in [0, " + std::to_string(n_experts) + ")", std::to_string(e));
    ++loads[size_t(e)];
  }
  return loads;
}

void update_expert_bias(float* bias, const int64_t* loads, int64_t n_experts, float rate) {
  // sign(mean − cᵢ) = sign(Σ c − n cᵢ), in integers: an expert exactly at the mean is left alone.
  int64_t total = 0;
  for (int64_t e = 0; e < n_experts; ++e) total += loads[e];
  for (int64_t e = 0; e < n_experts; ++e) {
    const int64_t diff = total - n_experts * loads[e];
    bias[e] += diff > 0 ? rate : diff < 0 ? -rate : 0.0f;
  }
}

}  // namespace dsv41::optim
