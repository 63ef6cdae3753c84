#pragma once
// The images of a chat request's image_url parts (docs/openai-api.md, "Images"): each URL must be
// a data: URL with base64 bytes (encoding.py's load_image_bytes, reading no files), or an http(s)
// URL where the operator lets the server fetch (server/image_fetch.h); decoded as PNG or JPEG
// (model/image/decode.h) and preprocessed for the model (engine/prompt_image.h). Everything a
// client can get wrong is an ApiError 400 naming the part.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/prompt_image.h"
#include "server/image_fetch.h"

namespace dsv41 {

// The bytes of a data: URL ("data:[<media type>];base64,<data>"). Base64 in the standard alphabet
// with its padding; ASCII whitespace in the data is skipped (MIME line breaks). `where` names the
// part in messages ("image 0").
std::vector<uint8_t> image_url_bytes(std::string_view url, const std::string& where);

// Image `index` of a request: its URL's bytes (fetched when `fetch` allows an http(s) URL),
// decoded and preprocessed under `config`.
std::shared_ptr<const ImageInput> load_image_url(std::string_view url, size_t index, const Config& config,
                                                 const ImageFetchOptions& fetch = {});

}  // namespace dsv41
