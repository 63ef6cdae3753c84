#pragma once
// How a layer's gate routes (model.py Gate), as both backends' routing ops take it.
#include <string>

#include "model/config.h"

namespace dsv41 {

struct GateOptions {
  int topk = 6;
  std::string score_func = "sqrtsoftplus";
  float gate_temp = 1.0f;
  bool norm_topk_prob = true;
  float route_scale = 1.0f;
};

// Layer `layer`'s gate: its activated experts and the config's score function, temperature,
// normalization and route scale.
GateOptions gate_options(const Config& config, int layer);

}  // namespace dsv41
