#pragma once
// Fetching an image_url part's http(s) URL (docs/openai-api.md, "Images"), when the operator lets
// the server do it (`dsv41 serve --fetch-image-urls`): a GET with a connect and read timeout,
// redirects followed, the body capped at a size, certificates checked for https. Off by default:
// a server that fetches makes requests to any address a client names, its own network included.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv41 {

struct ImageFetchOptions {
  bool enabled = false;
  int64_t max_bytes = int64_t(20) << 20;  // a body larger than this is refused, read no further
  int timeout_s = 10;                     // to connect, and between reads
};

// The body of a 200 answer to GET `url` (http:// or https://; no user:password@). Throws ApiError
// 400 "invalid_image" naming `where` for a URL it cannot take, a host it cannot reach, another
// status, or a body over the cap.
std::vector<uint8_t> fetch_image_url(std::string_view url, const ImageFetchOptions& options, const std::string& where);

}  // namespace dsv41
