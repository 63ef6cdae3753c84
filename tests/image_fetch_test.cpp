// Fetching image_url parts' http(s) URLs (server/image_fetch.h) against an HTTP server in this
// process on 127.0.0.1: the body of a 200, a redirect followed, and each refusal — another status,
// a body over the cap (announced by Content-Length or streamed without one), a server that does not
// answer within the timeout, a port nobody listens on, URLs the fetcher does not take — an ApiError
// 400 "invalid_image" naming the image and what it found.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "http_pages.h"
#include "server/image_fetch.h"
#include "server/openai_api.h"

namespace dsv41 {
namespace {

// The pages: /image (the bytes), /moved (302 to /image), /missing (404), /stream (the bytes in
// chunks, no Content-Length), /slow (answers after 2.5 s).
void routes(httplib::Server& server, const std::vector<uint8_t>& bytes) {
  const std::string body(bytes.begin(), bytes.end());
  server.Get("/image", [body](const httplib::Request&, httplib::Response& res) { res.set_content(body, "image/png"); });
  server.Get("/moved", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/image"); });
  server.Get("/missing", [](const httplib::Request&, httplib::Response& res) { res.status = 404; });
  server.Get("/stream", [body](const httplib::Request&, httplib::Response& res) {
    res.set_chunked_content_provider("image/png", [body](size_t offset, httplib::DataSink& sink) {
      if (offset >= body.size()) {
        sink.done();
        return true;
      }
      return sink.write(body.data() + offset, std::min<size_t>(1000, body.size() - offset));
    });
  });
  server.Get("/slow", [body](const httplib::Request&, httplib::Response& res) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));
    res.set_content(body, "image/png");
  });
}

struct Pages : test::HttpPages {
  explicit Pages(const std::vector<uint8_t>& bytes) : HttpPages([&](httplib::Server& s) { routes(s, bytes); }) {}
};

std::vector<uint8_t> some_bytes(size_t n) {
  std::vector<uint8_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = uint8_t(i * 131 + 7);
  return out;
}

// The message of the 400 that fetching `url` throws (empty, and a failure, if none).
std::string refusal(const std::string& url, const ImageFetchOptions& options) {
  try {
    fetch_image_url(url, options, "image 2");
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400) << url;
    EXPECT_EQ(e.code(), "invalid_image") << url;
    return e.what();
  }
  ADD_FAILURE() << url << ": fetched";
  return {};
}

ImageFetchOptions on(int64_t max_bytes = int64_t(1) << 20, int timeout_s = 10) {
  ImageFetchOptions o;
  o.enabled = true;
  o.max_bytes = max_bytes;
  o.timeout_s = timeout_s;
  return o;
}

TEST(ImageFetch, TheBodyOfA200AndOfARedirect) {
  const std::vector<uint8_t> bytes = some_bytes(30000);
  Pages pages(bytes);
  EXPECT_EQ(fetch_image_url(pages.url("/image"), on(), "image 0"), bytes);
  EXPECT_EQ(fetch_image_url(pages.url("/moved"), on(), "image 0"), bytes);
  EXPECT_EQ(fetch_image_url(pages.url("/stream"), on(), "image 0"), bytes);
  // A query is sent, a fragment is not (the server's route ignores the query).
  EXPECT_EQ(fetch_image_url(pages.url("/image?size=large#top"), on(), "image 0"), bytes);
  // Exactly at the cap is within it.
  EXPECT_EQ(fetch_image_url(pages.url("/image"), on(30000), "image 0"), bytes);
}

TEST(ImageFetch, RefusalsNameTheImageAndWhatWasFound) {
  Pages pages(some_bytes(30000));
  EXPECT_EQ(refusal(pages.url("/missing"), on()), "messages: image 2 url: expected a URL that answers 200, found status 404");
  EXPECT_EQ(refusal(pages.url("/image"), on(29999)),
            "messages: image 2: expected an image of at most 29999 bytes (--image-fetch-max-mb), found a body of 30000 bytes");
  EXPECT_EQ(refusal(pages.url("/stream"), on(29999)),
            "messages: image 2: expected an image of at most 29999 bytes (--image-fetch-max-mb), found a body of more than 29999 bytes");
  EXPECT_NE(refusal(pages.url("/slow"), on(int64_t(1) << 20, 1)).find("image 2 url: expected a URL this server can fetch within 1 s, found "),
            std::string::npos);
  EXPECT_EQ(refusal("ftp://127.0.0.1/image", on()), "messages: image 2 url: expected an http:// or https:// URL, found ftp://127.0.0.1/image");
  EXPECT_EQ(refusal("http:///image", on()), "messages: image 2 url: expected a host after http://, found none");
  EXPECT_EQ(refusal("http://user:secret@127.0.0.1/image", on()),
            "messages: image 2 url: expected a URL without user:password@, found credentials in it");
}

TEST(ImageFetch, APortNobodyListensOn) {
  std::string url;
  {
    Pages gone(some_bytes(10));
    url = gone.url("/image");
  }
  EXPECT_NE(refusal(url, on()).find("image 2 url: expected a URL this server can fetch within 10 s, found "), std::string::npos);
}

}  // namespace
}  // namespace dsv41
