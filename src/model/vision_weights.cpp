#include "model/vision_weights.h"

namespace dsv41 {

VisionWeights bind_vision_weights(const Config& c, const Checkpoint& ckpt) {
  VisionWeights w;
  w.blocks.resize(size_t(c.vision.n_layers));
  for_each_vision_tensor(c, [&](const VisionTensorSpec& t, Weight& field) { field = weight_of(ckpt.get(t.name)); }, w);
  return w;
}

}  // namespace dsv41
