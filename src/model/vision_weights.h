#pragma once
// Views of a checkpoint's vision tower (vision.py ViT and Aligner, the span delimiters of
// model.py; names as the official checkpoint's, listed in weights.cpp add_vision). All bf16
// nn.Linear weights and biases, except the RMSNorm weights, which vision.py declares fp32.
#include <string>
#include <vector>

#include "model/checkpoint.h"
#include "model/config.h"
#include "model/weight.h"

namespace dsv41 {

struct VisionBlockWeights {
  Weight norm1, wqkv, wqkv_bias, wo, wo_bias;  // attention: [3 vd, vd] + [3 vd], [vd, vd] + [vd]
  Weight norm2, w1, w2;                        // MLP: w1 [2 inter, vd] (gate, up), w2 [vd, inter]; no biases
};

struct VisionWeights {
  Weight patch_embed, patch_embed_bias;  // [vd, 3 p²], [vd]
  std::vector<VisionBlockWeights> blocks;
  Weight norm;                                                  // the ViT's final RMSNorm
  Weight aligner_w1, aligner_w1_bias, aligner_w2, aligner_w2_bias;  // [d, vd r²], [d, d] and biases
  Weight image_start, image_end, image_newline;                 // [d] each: the span's delimiters
};

// The one list of the tower's tensors: f(checkpoint name, the field of each of `towers`...) for
// every tensor, in checkpoint order. The CPU binding (bind_vision_weights) and the device placement
// (forward/device/device_model.cu) walk it; each tower's `blocks` must hold c.vision.n_layers.
template <class F, class... W>
void for_each_vision_tensor(const Config& c, F&& f, W&... towers) {
  f(std::string("vision.patch_embed.proj.weight"), towers.patch_embed...);
  f(std::string("vision.patch_embed.proj.bias"), towers.patch_embed_bias...);
  for (int b = 0; b < c.vision.n_layers; ++b) {
    const std::string p = "vision.blocks." + std::to_string(b) + ".";
    f(p + "norm1.weight", towers.blocks[size_t(b)].norm1...);
    f(p + "attn.wqkv.weight", towers.blocks[size_t(b)].wqkv...);
    f(p + "attn.wqkv.bias", towers.blocks[size_t(b)].wqkv_bias...);
    f(p + "attn.wo.weight", towers.blocks[size_t(b)].wo...);
    f(p + "attn.wo.bias", towers.blocks[size_t(b)].wo_bias...);
    f(p + "norm2.weight", towers.blocks[size_t(b)].norm2...);
    f(p + "mlp.w1.weight", towers.blocks[size_t(b)].w1...);
    f(p + "mlp.w2.weight", towers.blocks[size_t(b)].w2...);
  }
  f(std::string("vision.norm.weight"), towers.norm...);
  f(std::string("aligner.w1.weight"), towers.aligner_w1...);
  f(std::string("aligner.w1.bias"), towers.aligner_w1_bias...);
  f(std::string("aligner.w2.weight"), towers.aligner_w2...);
  f(std::string("aligner.w2.bias"), towers.aligner_w2_bias...);
  f(std::string("image_start"), towers.image_start...);
  f(std::string("image_end"), towers.image_end...);
  f(std::string("image_newline"), towers.image_newline...);
}

// Binds every vision tensor of `ckpt` (which must have them: check_weights first).
VisionWeights bind_vision_weights(const Config& c, const Checkpoint& ckpt);

}  // namespace dsv41
