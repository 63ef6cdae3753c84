#include "server/image_url.h"

#include "model/image/decode.h"
#include "server/openai_api.h"

namespace dsv41 {

namespace {

constexpr const char* kExpectedUrl = "a data: URL of base64 image bytes (data:image/png;base64,... or data:image/jpeg;base64,...)";

[[noreturn]] void refuse(const std::string& where, const std::string& expected, const std::string& found) {
  throw ApiError(400, "messages: " + where + ": expected " + expected + ", found " + found, "messages", "invalid_image");
}

int base64_value(unsigned char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

std::string quoted(std::string_view text) {
  std::string out = "\"";
  out += text;
  out += '"';
  return out;
}

bool ascii_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

}  // namespace

std::vector<uint8_t> image_url_bytes(std::string_view url, const std::string& where) {
  if (url.starts_with("http://") || url.starts_with("https://"))
    refuse(where + " url", kExpectedUrl, "an http(s) URL, which this server does not fetch (dsv41 serve --fetch-image-urls)");
  if (!url.starts_with("data:")) refuse(where + " url", kExpectedUrl, quoted(url.substr(0, 32)));
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos) refuse(where + " url", kExpectedUrl, "no ',' before the data");
  const std::string_view header = url.substr(5, comma - 5), data = url.substr(comma + 1);
  if (!header.ends_with(";base64"))
    refuse(where + " url", kExpectedUrl, quoted(url.substr(0, comma + 1).substr(0, 64)) + " (not base64)");

  std::vector<uint8_t> out;
  out.reserve(data.size() / 4 * 3);
  uint32_t bits = 0;
  int held = 0;     // bits pending in `bits`
  size_t count = 0;  // base64 characters, padding included
  size_t padding = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(data[i]);
    if (ascii_space(c)) continue;
    if (c == '=') {
      ++padding;
      ++count;
      continue;
    }
    const int v = base64_value(c);
    if (v < 0 || padding > 0)
      refuse(where, "base64 data (A-Z, a-z, 0-9, +, / and = padding at the end)",
             (v < 0 ? "the character " + (c >= 0x20 && c < 0x7f ? "'" + std::string(1, char(c)) + "'" : "byte " + std::to_string(c))
                    : std::string("data after '=' padding")) +
                 " at offset " + std::to_string(i) + " of the data");
    ++count;
    bits = (bits << 6) | uint32_t(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out.push_back(uint8_t(bits >> held));
    }
  }
  if (count % 4 != 0 || padding > 2)
    refuse(where, "base64 data of whole 4-character groups (padded with =)",
           std::to_string(count) + " characters" + (padding > 2 ? " with " + std::to_string(padding) + " '='" : ""));
  if (out.empty()) refuse(where, "base64 image bytes", "no data");
  return out;
}

std::shared_ptr<const ImageInput> load_image_url(std::string_view url, size_t index, const Config& config,
                                                 const ImageFetchOptions& fetch) {
  const std::string where = "image " + std::to_string(index);
  const bool remote = url.starts_with("http://") || url.starts_with("https://");
  const std::vector<uint8_t> bytes = remote && fetch.enabled ? fetch_image_url(url, fetch, where) : image_url_bytes(url, where);
  try {
    return prepare_image(decode_image(bytes.data(), bytes.size()), config);
  } catch (const ImageError& e) {
    throw ApiError(400, "messages: " + where + ": " + e.what(), "messages", "invalid_image");
  }
}

}  // namespace dsv41
