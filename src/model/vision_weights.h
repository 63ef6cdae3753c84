#pragma once
// Views of a checkpoint's vision tower (vision.py ViT and Aligner, the span delimiters of
// model.py; names as the official checkpoint's, listed by for_each_vision_tensor). All bf16
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

// A tensor of the tower as the checkpoint holds it.
struct VisionTensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// The one list of the tower's tensors: f(the tensor, the field of each of `towers`...) for every
// tensor, in checkpoint order. The weights map (weights.cpp expected_tensors), the CPU binding
// (bind_vision_weights) and the device placement (forward/device/device_model.cu) walk it; each
// tower's `blocks` must hold c.vision.n_layers. vision.py declares its RMSNorm weights fp32 (the
// text model's are bf16), and the reference's fixture v41-tiny-vision stores them so (docs/vision.md §5).
template <class F, class... W>
void for_each_vision_tensor(const Config& c, F&& f, W&... towers) {
  const VisionConfig& v = c.vision;
  const int64_t vd = v.dim, inter = v.inter_dim, r2 = int64_t(v.downsample_ratio) * v.downsample_ratio;
  auto bf16 = [](std::string name, std::vector<int64_t> shape) { return VisionTensorSpec{std::move(name), DType::BF16, std::move(shape)}; };
  auto norm = [&](std::string name) { return VisionTensorSpec{std::move(name), DType::F32, {vd}}; };
  f(bf16("vision.patch_embed.proj.weight", {vd, 3LL * v.patch_size * v.patch_size}), towers.patch_embed...);
  f(bf16("vision.patch_embed.proj.bias", {vd}), towers.patch_embed_bias...);
  for (int b = 0; b < v.n_layers; ++b) {
    const std::string p = "vision.blocks." + std::to_string(b) + ".";
    f(norm(p + "norm1.weight"), towers.blocks[size_t(b)].norm1...);
    f(bf16(p + "attn.wqkv.weight", {3 * vd, vd}), towers.blocks[size_t(b)].wqkv...);
    f(bf16(p + "attn.wqkv.bias", {3 * vd}), towers.blocks[size_t(b)].wqkv_bias...);
    f(bf16(p + "attn.wo.weight", {vd, vd}), towers.blocks[size_t(b)].wo...);
    f(bf16(p + "attn.wo.bias", {vd}), towers.blocks[size_t(b)].wo_bias...);
    f(norm(p + "norm2.weight"), towers.blocks[size_t(b)].norm2...);
    f(bf16(p + "mlp.w1.weight", {2 * inter, vd}), towers.blocks[size_t(b)].w1...);
    f(bf16(p + "mlp.w2.weight", {vd, inter}), towers.blocks[size_t(b)].w2...);
  }
  f(norm("vision.norm.weight"), towers.norm...);
  f(bf16("aligner.w1.weight", {c.dim, vd * r2}), towers.aligner_w1...);
  f(bf16("aligner.w1.bias", {c.dim}), towers.aligner_w1_bias...);
  f(bf16("aligner.w2.weight", {c.dim, c.dim}), towers.aligner_w2...);
  f(bf16("aligner.w2.bias", {c.dim}), towers.aligner_w2_bias...);
  f(bf16("image_start", {c.dim}), towers.image_start...);
  f(bf16("image_end", {c.dim}), towers.image_end...);
  f(bf16("image_newline", {c.dim}), towers.image_newline...);
}

// Binds every vision tensor of `ckpt` (which must have them: check_weights first).
VisionWeights bind_vision_weights(const Config& c, const Checkpoint& ckpt);

}  // namespace dsv41
