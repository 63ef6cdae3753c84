#pragma once
// Views of a checkpoint's vision tower (vision.py ViT and Aligner, the span delimiters of
// model.py; names as the official checkpoint's, listed in weights.cpp add_vision). All bf16
// nn.Linear weights and biases, except the RMSNorm weights, which vision.py declares fp32.
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

// Binds every vision tensor of `ckpt` (which must have them: check_weights first).
VisionWeights bind_vision_weights(const Config& c, const Checkpoint& ckpt);

}  // namespace dsv41
