#include "engine/prompt_image.h"

#include <xxhash.h>

#include <algorithm>
#include <string>

#include "base/error.h"
#include "engine/chat_format.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

namespace {

BlockKey content_hash(const RgbImage& image) {
  XXH3_state_t* state = XXH3_createState();
  if (!state) fail("image hash", "memory for an XXH3 state", "none");
  XXH3_128bits_reset(state);
  // The sides as little-endian 32-bit words, then the pixels.
  uint8_t sides[8];
  for (int i = 0; i < 4; ++i) {
    sides[i] = uint8_t(uint32_t(image.width) >> (8 * i));
    sides[4 + i] = uint8_t(uint32_t(image.height) >> (8 * i));
  }
  XXH3_128bits_update(state, sides, sizeof sides);
  XXH3_128bits_update(state, image.pixels.data(), image.pixels.size());
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return BlockKey{h.high64, h.low64};
}

}  // namespace

std::shared_ptr<const ImageInput> prepare_image(const RgbImage& image, const Config& config) {
  if (!config.has_vision())
    throw ImageError(config.source + ": expected a model with a vision tower (vision_n_layers > 0) for images, found a text-only model");
  if (image.width < 1 || image.height < 1 || image.pixels.size() != size_t(image.width) * size_t(image.height) * 3)
    throw ImageError("image: expected an RGB image of at least 1 x 1 pixels, found " + std::to_string(image.width) + " x " +
                     std::to_string(image.height) + " with " + std::to_string(image.pixels.size()) + " bytes");
  auto in = std::make_shared<ImageInput>();
  in->width = image.width;
  in->height = image.height;
  in->plan = plan_image(image.width, image.height, config.vision);
  in->patches = image_patches(fit_image(image, in->plan, config.vision), in->plan, config.vision.patch_size);
  in->content = content_hash(image);
  return in;
}

void check_images(std::span<const int> prompt, std::span<const PromptImage> images, const Config& config) {
  if (!images.empty() && !config.has_vision())
    fail("prompt", "no images for a model without a vision tower", std::to_string(images.size()) + " images");
  int64_t previous_end = 0;
  for (size_t i = 0; i < images.size(); ++i) {
    const PromptImage& im = images[i];
    const std::string where = "prompt image " + std::to_string(i);
    if (!im.image) fail(where, "an image", "none");
    if (im.start < previous_end || im.end() > int64_t(prompt.size()))
      fail(where, "a span after the previous image's (from " + std::to_string(previous_end) + ") and inside the prompt's " +
                      std::to_string(prompt.size()) + " tokens",
           "[" + std::to_string(im.start) + ", " + std::to_string(im.end()) + ")");
    for (int64_t p = im.start; p < im.end(); ++p)
      if (prompt[size_t(p)] != config.image_token_id)
        fail(where, "image_token_id " + std::to_string(config.image_token_id) + " at every position of its span",
             std::to_string(prompt[size_t(p)]) + " at position " + std::to_string(p));
    previous_end = im.end();
  }
}

std::vector<int> encode_with_images(const Tokenizer& tokenizer, std::string_view text, bool add_special_tokens,
                                    std::span<const std::shared_ptr<const ImageInput>> images, const Config& config,
                                    std::vector<PromptImage>& placed) {
  std::vector<int> ids;
  placed.clear();
  size_t at = 0, next = 0;
  bool first = true;
  for (;;) {
    const size_t found = text.find(chat_token::kImage, at);
    const std::string_view piece = text.substr(at, found == std::string_view::npos ? std::string_view::npos : found - at);
    if (!piece.empty() || first) {
      const std::vector<int> encoded = tokenizer.encode(piece, first && add_special_tokens);
      ids.insert(ids.end(), encoded.begin(), encoded.end());
    }
    first = false;
    if (found == std::string_view::npos) break;
    if (next < images.size()) {
      placed.push_back(PromptImage{int64_t(ids.size()), images[next]});
      ids.insert(ids.end(), size_t(images[next]->plan.span_tokens()), int(config.image_token_id));
    }
    ++next;
    at = found + chat_token::kImage.size();
  }
  if (next != images.size())
    fail("prompt", std::to_string(images.size()) + " image placeholders " + std::string(chat_token::kImage) + ", one per image",
         std::to_string(next));
  return ids;
}

std::vector<ImageSpanKey> image_keys(std::span<const PromptImage> images) {
  std::vector<ImageSpanKey> keys;
  for (const PromptImage& im : images) keys.push_back(im.key());
  return keys;
}

std::vector<uint8_t> span_marks(std::span<const PromptImage> images, int64_t from, int64_t n) {
  std::vector<uint8_t> marks(size_t(n), 0);
  for (const PromptImage& im : images)
    for (int64_t p = std::max(im.start, from); p < std::min(im.end(), from + n); ++p) marks[size_t(p - from)] = 1;
  return marks;
}

std::vector<int> text_tokens(std::span<const int> prompt, std::span<const PromptImage> images) {
  const std::vector<uint8_t> marks = span_marks(images, 0, int64_t(prompt.size()));
  std::vector<int> text;
  for (size_t i = 0; i < prompt.size(); ++i)
    if (!marks[i]) text.push_back(prompt[i]);
  return text;
}

int64_t image_span_tokens(std::span<const PromptImage> images) {
  int64_t n = 0;
  for (const PromptImage& im : images) n += im.image->plan.span_tokens();
  return n;
}

}  // namespace dsv41
