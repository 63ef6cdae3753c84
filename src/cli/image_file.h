#pragma once
// An image file for `generate --image` and `chat`'s /image (docs/vision.md): read, decoded as PNG
// or JPEG and preprocessed for the model; dsv41::Error (ImageError for the picture itself) naming
// the file otherwise.
#include <memory>
#include <string>

#include "engine/prompt_image.h"

namespace dsv41::cli {

std::shared_ptr<const ImageInput> load_image_file(const std::string& path, const Config& config);

}  // namespace dsv41::cli
