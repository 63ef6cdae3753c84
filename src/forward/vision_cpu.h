#pragma once
// The vision tower on the CPU executor: forward/vision_network.h over the CPU op set
// (backend/cpu/vision.h, vision_rope.h, pixel_unshuffle.h, norm.h).
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/vision_weights.h"

namespace dsv41 {

// One image's input: its normalised patches (image/preprocess.h image_patches: bf16 bits,
// [n_vit_h · n_vit_w, 3·p·p]) and its patch grid.
struct VisionImage {
  const uint16_t* patches = nullptr;
  int n_vit_h = 0, n_vit_w = 0;
};

// The aligner's output for each image, in order: [ceil(n_vit_h/r) · ceil(n_vit_w/r), dim] bf16
// values, the embeddings of the image's IMAGE tokens in reading order. All images go through one
// call (their patches stacked); each image's result does not depend on the others.
std::vector<std::vector<float>> encode_images(const Config& c, const VisionWeights& w,
                                              const std::vector<VisionImage>& images);

}  // namespace dsv41
