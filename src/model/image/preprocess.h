#pragma once
// The reference's image preprocessing (image_processor.py; docs/vision.md §2-§4, §7): the resize
// plan, the fitting of the image to it (ImageOps.pad, or a plain resize), the normalised bf16
// patches the ViT takes, and the layout of the image's span of tokens in the prompt.
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/image/image.h"

namespace dsv41 {

// plan_image_grid's answer for one image.
struct ImagePlan {
  int best_width = 0, best_height = 0;  // the fitted image, multiples of the patch size
  int n_vit_h = 0, n_vit_w = 0;         // the ViT's patch grid
  int n_llm_h = 0, n_llm_w = 0;         // the aligner's token grid (IMAGE tokens: n_llm_h · n_llm_w)

  int64_t patches() const { return int64_t(n_vit_h) * n_vit_w; }
  int64_t image_tokens() const { return int64_t(n_llm_h) * n_llm_w; }
  // The whole span: IMAGE_START, n_llm_h rows of n_llm_w IMAGE and one IMAGE_NEW_LINE, IMAGE_END.
  int64_t span_tokens() const { return int64_t(n_llm_h) * (n_llm_w + 1) + 2; }
};

// The plan for an image of width × height (>= 1) under the config's vision settings, by the
// reference's own double-precision steps; ImageError where the reference's assertion would fail.
ImagePlan plan_image(int width, int height, const VisionConfig& v);

// The image fitted to the plan as load_image does it: with vision_max_wh_ratio set and a wide
// enough image, a plain bicubic resize; otherwise ImageOps.pad with grey (127, 127, 127).
RgbImage fit_image(const RgbImage& image, const ImagePlan& plan, const VisionConfig& v);

// The bf16 value (its bits) the reference feeds the ViT for an 8-bit level v:
// bf16((float(v) / 255 - 0.5) / 0.5), each step in fp32.
uint16_t normalized_level(uint8_t v);

// The fitted image's patches, [n_vit_h · n_vit_w, 3 · p · p] bf16 bits: patches row-major over the
// grid, each channel-major, then by row and column within the patch (load_image's reshape/permute,
// flattened as PatchEmbed flattens it). `fitted` must be best_width × best_height.
std::vector<uint16_t> image_patches(const RgbImage& fitted, const ImagePlan& plan, int patch_size);

// The token types of a span (image_processor.py): TEXT marks the prompt's other tokens.
enum class TokenType : int8_t { Text = -1, ImageStart = 0, Image = 1, ImageNewLine = 2, ImageEnd = 3 };

// The span's token types in order (span_tokens() of them).
std::vector<TokenType> image_token_types(const ImagePlan& plan);

}  // namespace dsv41
