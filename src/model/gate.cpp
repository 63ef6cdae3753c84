#include "model/gate.h"

namespace dsv41 {

GateOptions gate_options(const Config& c, int layer) {
  GateOptions opt;
  opt.topk = c.activated_experts(layer);
  opt.score_func = c.score_func;
  opt.gate_temp = float(c.gate_temp);
  opt.norm_topk_prob = c.norm_topk_prob;
  opt.route_scale = float(c.route_scale);
  return opt;
}

}  // namespace dsv41
