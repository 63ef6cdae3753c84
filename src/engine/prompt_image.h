#pragma once
// A prompt's images (docs/vision.md §7): each one preprocessed once when its request arrives (its
// resize plan and ViT patches), hashed for the prefix keys, and placed in the prompt as its span of
// image_token_id; the vision tower encodes it only when a row of its span runs (engine/session.h),
// so an image whose span the KV tiers hold is never encoded.
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kv/prefix_key.h"
#include "model/config.h"
#include "model/image/image.h"
#include "model/image/preprocess.h"

namespace dsv41 {

class Tokenizer;

// An image as the engine takes it: what the reference's load_image makes of it.
struct ImageInput {
  int width = 0, height = 0;      // as decoded
  ImagePlan plan;                 // its grids and span
  std::vector<uint16_t> patches;  // [n_vit_h · n_vit_w, 3·p·p] bf16 bits (image_patches)
  // XXH3-128 of the width, height and RGB8 pixels as decoded: two files of one picture (a PNG
  // compressed two ways) share it, and with it their cached KV.
  BlockKey content;
};

// Plans, fits and cuts a decoded image (model/image/decode.h) under the config's vision settings.
// Throws ImageError where the reference's preprocessing would fail, and for a model without a
// vision tower.
std::shared_ptr<const ImageInput> prepare_image(const RgbImage& image, const Config& config);

// An image placed in a prompt: its span is the prompt's positions [start, end()).
struct PromptImage {
  int64_t start = 0;
  std::shared_ptr<const ImageInput> image;
  int64_t end() const { return start + image->plan.span_tokens(); }
  ImageSpanKey key() const { return ImageSpanKey{start, image->plan.span_tokens(), image->content}; }
};

// Throws dsv41::Error unless `images` are in order of their starts, their spans disjoint and
// inside a prompt of `prompt_tokens` tokens, every span position holding config.image_token_id,
// and the model has a vision tower when there are any.
void check_images(std::span<const int> prompt, std::span<const PromptImage> images, const Config& config);

// prepare_vl_inputs: `text` encoded with each image placeholder (chat_token::kImage, the
// tokenizer's <｜deepseek_image｜>) standing for the next of `images`: the
// text between placeholders through the tokenizer (the first piece with add_special_tokens, the
// others without, so that a tokenizer whose added tokens include the placeholder gives the ids it
// would give the whole text), each placeholder as its image's span. `placed` receives the images
// at their spans. Throws dsv41::Error when the placeholders and the images differ in number.
std::vector<int> encode_with_images(const Tokenizer& tokenizer, std::string_view text, bool add_special_tokens,
                                    std::span<const std::shared_ptr<const ImageInput>> images, const Config& config,
                                    std::vector<PromptImage>& placed);

// The keys of images for the KV tiers.
std::vector<ImageSpanKey> image_keys(std::span<const PromptImage> images);

// Per position of [from, from + n): 1 inside a span of `images`, else 0 (the Engram hasher's marks).
std::vector<uint8_t> span_marks(std::span<const PromptImage> images, int64_t from, int64_t n);

// The tokens of `prompt` outside the images' spans (what a sampler's penalties count).
std::vector<int> text_tokens(std::span<const int> prompt, std::span<const PromptImage> images);

// The image-span tokens of a prompt (usage's image_tokens).
int64_t image_span_tokens(std::span<const PromptImage> images);

}  // namespace dsv41
