#pragma once
// The vision tower, written once (docs/vision.md §5-§6): model.py's encode_image, i.e. vision.py's
// ViT.forward then Aligner.forward. Each executor runs it over its own op set, whose rows are one
// call's images' patches one after another: the GEMMs run over all of them together, while RoPE,
// attention and the unshuffle work image by image (each op set knows the call's images and their
// grids). What an op set must offer (Tensor = its activations, [rows, cols], bf16 values):
//
//   patches()                  the call's patch rows [Σ N_p, 3·p·p]
//   linear(x, w, bias)         bf16(x·Wᵀ + bias), fp32 product; bias may be null
//   norm(x, w)                 the vision RMSNorm (eps 1e-6, fp32 weight), bf16 out
//   rope(qkv)                  the 2D RoPE on the q and k thirds of each row, at its patch's place
//   attention(qkv)             [rows, vd]: each image's patches attend to all of that image's
//   add(x, y)                  x = bf16(x + y)
//   silu_mul(gu)               bf16(silu(gate)·up) of w1's halves
//   unshuffle(x)               each image's r×r pixel unshuffle: [Σ N_t, vd·r²]
//   gelu(x)                    x = bf16(gelu(x))
// The result: the aligner's rows [Σ N_t, dim], each image's IMAGE-token embeddings in reading order.
#include "model/config.h"
#include "model/vision_weights.h"

namespace dsv41 {

template <class Ops>
typename Ops::Tensor run_vision(const VisionConfig& v, const VisionWeights& w, Ops& ops) {
  typename Ops::Tensor x = ops.linear(ops.patches(), w.patch_embed, &w.patch_embed_bias);
  for (int b = 0; b < v.n_layers; ++b) {
    const VisionBlockWeights& k = w.blocks[size_t(b)];
    typename Ops::Tensor qkv = ops.linear(ops.norm(x, k.norm1), k.wqkv, &k.wqkv_bias);
    ops.rope(qkv);
    ops.add(x, ops.linear(ops.attention(qkv), k.wo, &k.wo_bias));
    typename Ops::Tensor gate_up = ops.linear(ops.norm(x, k.norm2), k.w1, nullptr);
    ops.add(x, ops.linear(ops.silu_mul(gate_up), k.w2, nullptr));
  }
  typename Ops::Tensor tokens = ops.unshuffle(ops.norm(x, w.norm));
  typename Ops::Tensor hidden = ops.linear(tokens, w.aligner_w1, &w.aligner_w1_bias);
  ops.gelu(hidden);
  return ops.linear(hidden, w.aligner_w2, &w.aligner_w2_bias);
}

}  // namespace dsv41
