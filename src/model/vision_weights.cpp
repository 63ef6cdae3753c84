#include "model/vision_weights.h"

#include <string>

namespace dsv41 {

VisionWeights bind_vision_weights(const Config& c, const Checkpoint& ckpt) {
  auto get = [&](const std::string& name) { return weight_of(ckpt.get(name)); };
  VisionWeights w;
  w.patch_embed = get("vision.patch_embed.proj.weight");
  w.patch_embed_bias = get("vision.patch_embed.proj.bias");
  w.blocks.resize(size_t(c.vision.n_layers));
  for (int b = 0; b < c.vision.n_layers; ++b) {
    const std::string p = "vision.blocks." + std::to_string(b) + ".";
    VisionBlockWeights& k = w.blocks[size_t(b)];
    k.norm1 = get(p + "norm1.weight");
    k.wqkv = get(p + "attn.wqkv.weight");
    k.wqkv_bias = get(p + "attn.wqkv.bias");
    k.wo = get(p + "attn.wo.weight");
    k.wo_bias = get(p + "attn.wo.bias");
    k.norm2 = get(p + "norm2.weight");
    k.w1 = get(p + "mlp.w1.weight");
    k.w2 = get(p + "mlp.w2.weight");
  }
  w.norm = get("vision.norm.weight");
  w.aligner_w1 = get("aligner.w1.weight");
  w.aligner_w1_bias = get("aligner.w1.bias");
  w.aligner_w2 = get("aligner.w2.weight");
  w.aligner_w2_bias = get("aligner.w2.bias");
  w.image_start = get("image_start");
  w.image_end = get("image_end");
  w.image_newline = get("image_newline");
  return w;
}

}  // namespace dsv41
