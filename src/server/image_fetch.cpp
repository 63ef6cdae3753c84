#include "server/image_fetch.h"

#include <httplib.h>

#include <charconv>
#include <memory>

#include "server/openai_api.h"

namespace dsv41 {

namespace {

[[noreturn]] void refuse(const std::string& where, const std::string& expected, const std::string& found) {
  throw ApiError(400, "messages: " + where + ": expected " + expected + ", found " + found, "messages", "invalid_image");
}

}  // namespace

std::vector<uint8_t> fetch_image_url(std::string_view url, const ImageFetchOptions& options, const std::string& where) {
  const std::string at = where + " url";
  const size_t scheme_end = url.find("://");
  const std::string_view scheme = scheme_end == std::string_view::npos ? std::string_view() : url.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") refuse(at, "an http:// or https:// URL", std::string(url.substr(0, 32)));
  // scheme://authority[/path][?query][#fragment]: the client takes scheme://authority, the GET the
  // rest (a fragment is the client's own business: never sent).
  const std::string_view rest = url.substr(scheme_end + 3);
  const size_t authority_end = std::min(rest.find_first_of("/?#"), rest.size());
  const std::string_view authority = rest.substr(0, authority_end);
  if (authority.empty()) refuse(at, "a host after " + std::string(scheme) + "://", "none");
  if (authority.find('@') != std::string_view::npos) refuse(at, "a URL without user:password@", "credentials in it");
  const std::string_view path = rest.substr(authority_end, std::min(rest.find('#'), rest.size()) - authority_end);
  std::string target = "/";
  target += path.starts_with('/') ? path.substr(1) : path;  // "?q" alone asks for "/?q"

  std::unique_ptr<httplib::Client> client;
  try {
    client = std::make_unique<httplib::Client>(std::string(scheme) + "://" + std::string(authority));
  } catch (const std::exception& e) {
    refuse(at, "a URL the HTTP client takes", e.what());
  }
  if (!client->is_valid()) refuse(at, "a host[:port] the HTTP client takes", std::string(authority));
  client->set_connection_timeout(options.timeout_s, 0);
  client->set_read_timeout(options.timeout_s, 0);
  client->set_write_timeout(options.timeout_s, 0);
  client->set_follow_location(true);
  client->enable_server_certificate_verification(true);

  int status = 0;
  std::string too_big;  // what passed the cap, once something did
  std::vector<uint8_t> body;
  const httplib::Result r = client->Get(
      target, httplib::Headers{{"Accept", "image/png, image/jpeg"}},
      [&](const httplib::Response& response) {
        status = response.status;
        const std::string length = response.get_header_value("Content-Length");
        int64_t n = -1;
        std::from_chars(length.data(), length.data() + length.size(), n);
        if (n > options.max_bytes) too_big = "a body of " + std::to_string(n) + " bytes";
        return status == 200 && too_big.empty();
      },
      [&](const char* data, size_t n) {
        if (int64_t(body.size() + n) > options.max_bytes) {
          too_big = "a body of more than " + std::to_string(options.max_bytes) + " bytes";
          return false;
        }
        body.insert(body.end(), data, data + n);
        return true;
      });
  if (!too_big.empty()) refuse(where, "an image of at most " + std::to_string(options.max_bytes) + " bytes (--image-fetch-max-mb)", too_big);
  if (status != 0 && status != 200) refuse(at, "a URL that answers 200", "status " + std::to_string(status));
  if (!r) refuse(at, "a URL this server can fetch within " + std::to_string(options.timeout_s) + " s", httplib::to_string(r.error()));
  if (body.empty()) refuse(where, "image bytes from " + std::string(url.substr(0, 64)), "an empty body");
  return body;
}

}  // namespace dsv41
