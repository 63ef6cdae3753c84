// Images through the HTTP server (docs/openai-api.md, "Images"), on a random checkpoint of the
// tiny-vision preset: an image chat round trip whose usage counts the image's tokens and whose
// repeat has them cached, while another image behind the same text does not; the image's place in
// the prompt where its part stands; bad images (truncated PNG, a 20000 x 20000 header, wrong base64,
// SVG, an http URL, a text-only model) refused with 400 and a message, the server serving on; an
// http URL fetched where the server is told to; the official openai client sending an image
// (tests/e2e/images.mjs).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "http_pages.h"
#include "image_writers.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "model/tokenizer/tokenizer.h"
#include "running_server.h"
#include "test_util.h"

namespace dsv41 {
namespace {

using json = nlohmann::json;

std::string base64(const std::vector<uint8_t>& bytes) {
  static const char* abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t n = uint32_t(bytes[i]) << 16 | (i + 1 < bytes.size() ? uint32_t(bytes[i + 1]) << 8 : 0) |
                       (i + 2 < bytes.size() ? uint32_t(bytes[i + 2]) : 0);
    out += abc[n >> 18];
    out += abc[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? abc[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? abc[n & 63] : '=';
  }
  return out;
}

// A PNG of seeded random RGB pixels.
std::vector<uint8_t> png(int w, int h, uint32_t seed) {
  std::vector<uint8_t> raw(size_t(w) * size_t(h) * 3);
  uint32_t x = seed * 2654435761u + 1;
  for (uint8_t& v : raw) {
    x = x * 1664525u + 1013904223u;
    v = uint8_t(x >> 24);
  }
  return test::write_png(test::PngSpec(w, h), raw);
}

std::string data_url(const std::vector<uint8_t>& bytes, const std::string& type = "image/png") {
  return "data:" + type + ";base64," + base64(bytes);
}

// Text after the image, long enough that the prompt's first cache block (64 tokens) ends in it.
const char* kQuestion =
    "Describe this picture: its colours, its shapes, what it shows, and anything unusual about it, in a few short "
    "sentences for someone who cannot see it. Mention the light and the background too.";

json ask(const std::string& model, const std::string& url) {
  return {{"model", model},
          {"messages", json::array({{{"role", "user"},
                                     {"content", json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}},
                                                              {{"type", "text"}, {"text", kQuestion}}})}}})},
          {"max_tokens", 4},
          {"temperature", 0},
          {"chat_template_kwargs", {{"thinking", false}}}};
}

class ServerImages : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("server_images");
    RandomCheckpointOptions o;
    o.seed = 5;
    write_random_checkpoint(preset("tiny-vision"), model_dir(), o);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string model_dir() { return (*dir_ / "tiny-vision").string(); }
  static ServerOptions options() {
    ServerOptions o;
    o.model_dir = model_dir();
    return o;
  }
  static test::TempDir* dir_;
};
test::TempDir* ServerImages::dir_ = nullptr;

TEST_F(ServerImages, AnImageChatRoundTripAndItsCache) {
  test::RunningServer server(options());
  const std::string a = data_url(png(90, 130, 1)), b = data_url(png(90, 130, 2));
  const json first = server.post("/v1/chat/completions", ask("tiny-vision", a));
  const json& usage = first["usage"];
  // 90 x 130 under the tiny vision config: a 4 x 3 token grid, a span of 4 · (3 + 1) + 2 = 18.
  EXPECT_EQ(usage["prompt_tokens_details"]["image_tokens"], 18) << first;
  EXPECT_GT(usage["prompt_tokens"].get<int64_t>(), 64 + 18) << first;
  EXPECT_TRUE(first["choices"][0]["message"]["content"].is_string()) << first;

  // The same request: its whole blocks of 64 tokens (the first holds the image) come from the host
  // cache, all but the last token, with default mode's encoder replay of the window before the hit
  // (W = 16 rows). (Its KV is not a cold run's bit for bit, so on random weights its greedy reply
  // may differ: forward_image_test checks exact mode's replay through an image span.)
  const json again = server.post("/v1/chat/completions", ask("tiny-vision", a));
  const int64_t prompt = usage["prompt_tokens"];
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["cached_tokens"], (prompt - 1) / 64 * 64) << again;
  EXPECT_EQ(again["usage"]["prompt_tokens_details"]["replayed_tokens"], 16) << again;
  // Another picture behind the same text: nothing cached.
  const json other = server.post("/v1/chat/completions", ask("tiny-vision", b));
  EXPECT_EQ(other["usage"]["prompt_tokens"], usage["prompt_tokens"]);
  EXPECT_EQ(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << other;
}

// The image's span stands where its part does (encoding.py joins the parts with "\n\n"): /tokenize
// of a chat request whose text part comes first gives the rendered text before the placeholder,
// the span of image_token_id, then the text after it; a text-only request has no image_tokens.
TEST_F(ServerImages, TheSpanStandsWhereThePartIs) {
  test::RunningServer server(options());
  const Tokenizer tokenizer = Tokenizer::from_file(model_dir() + "/tokenizer.json");
  const int image_id = preset("tiny-vision").image_token_id;
  json request = ask("tiny-vision", data_url(png(112, 70, 3)));
  std::swap(request["messages"][0]["content"][0], request["messages"][0]["content"][1]);  // text first
  const std::vector<int> ids = server.post("/tokenize", request)["tokens"];
  // 112 x 70: a 2 x 3 grid, a span of 10.
  std::vector<int> expected = tokenizer.encode("<｜begin▁of▁sentence｜><｜User｜>" + std::string(kQuestion) + "\n\n", false);
  expected.insert(expected.end(), 10, image_id);
  const std::vector<int> after = tokenizer.encode("<｜Assistant｜></think>", false);
  expected.insert(expected.end(), after.begin(), after.end());
  EXPECT_EQ(ids, expected);

  request["messages"][0]["content"].erase(1);  // the text part alone
  const json reply = server.post("/v1/chat/completions", request);
  EXPECT_FALSE(reply["usage"]["prompt_tokens_details"].contains("image_tokens")) << reply;
}

TEST_F(ServerImages, BadImagesAre400AndTheServerServesOn) {
  test::RunningServer server(options());
  const std::vector<uint8_t> good = png(40, 40, 4);
  const std::vector<uint8_t> truncated(good.begin(), good.begin() + int64_t(good.size() / 2));
  const std::vector<uint8_t> huge = test::write_png(test::PngSpec(20000, 20000), {}, /*header_only=*/true);
  const std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\"></svg>";
  const struct {
    const char* what;
    std::string url, says;
  } cases[] = {
      {"a truncated PNG", data_url(truncated), "image 0: image: expected a valid PNG, found a corrupt one"},
      {"a 20000 x 20000 header", data_url(huge), "image 0: image: expected at most 89478485 pixels, found a PNG of 20000 x 20000"},
      {"wrong base64", "data:image/png;base64,iVBOR*w0KGgo=", "image 0: expected base64 data (A-Z, a-z, 0-9, +, / and = padding at the end), found the character '*'"},
      {"base64 cut short", "data:image/png;base64,iVBORw0KG", "image 0: expected base64 data of whole 4-character groups"},
      {"SVG", data_url(std::vector<uint8_t>(svg.begin(), svg.end()), "image/svg+xml"), "expected PNG or JPEG data, found SVG"},
      {"an http URL", "https://example.com/cat.png", "image 0 url: expected a data: URL of base64 image bytes"},
      {"a data: URL that is not base64", "data:image/png,abc", "(not base64)"},
      {"a file path", "/etc/passwd", "image 0 url: expected a data: URL"},
  };
  for (const auto& c : cases) {
    const json r = server.post("/v1/chat/completions", ask("tiny-vision", c.url), 400);
    const std::string message = r["error"]["message"];
    EXPECT_NE(message.find(c.says), std::string::npos) << c.what << ": " << message;
    EXPECT_EQ(r["error"]["param"], "messages") << c.what;
    EXPECT_EQ(r["error"]["code"], "invalid_image") << c.what;
  }
  // An image part in another role's message, and the placeholder typed as text.
  json system_image = ask("tiny-vision", data_url(good));
  system_image["messages"][0]["role"] = "system";
  EXPECT_NE(server.post("/v1/chat/completions", system_image, 400)["error"]["message"].get<std::string>().find("image parts only in user messages"),
            std::string::npos);
  json typed = ask("tiny-vision", data_url(good));
  typed["messages"][0]["content"] = "see <｜deepseek_image｜>";
  EXPECT_NE(server.post("/v1/chat/completions", typed, 400)["error"]["message"].get<std::string>().find("found the image placeholder"),
            std::string::npos);
  EXPECT_EQ(server.post("/v1/chat/completions", ask("tiny-vision", data_url(good)))["choices"].size(), 1u);
}

// With --fetch-image-urls, an http URL's image is the image its bytes make: the prompt's tokens
// are the data: URL's, and after the data: URL ran, the fetched one hits its cached blocks (the
// prefix key hashes the image's content). A 404 is a 400 naming the image, the server serving on.
TEST_F(ServerImages, FetchedUrlsWhenAllowed) {
  const std::vector<uint8_t> bytes = png(90, 130, 7);
  test::HttpPages pages([&](httplib::Server& s) {
    s.Get("/cat.png", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(bytes.begin(), bytes.end()), "image/png");
    });
  });
  ServerOptions o = options();
  o.image_fetch.enabled = true;
  test::RunningServer server(o);
  const json by_data = server.post("/tokenize", ask("tiny-vision", data_url(bytes)));
  EXPECT_EQ(server.post("/tokenize", ask("tiny-vision", pages.url("/cat.png")))["tokens"], by_data["tokens"]);
  const json first = server.post("/v1/chat/completions", ask("tiny-vision", data_url(bytes)));
  const json fetched = server.post("/v1/chat/completions", ask("tiny-vision", pages.url("/cat.png")));
  EXPECT_EQ(fetched["usage"]["prompt_tokens_details"]["image_tokens"], 18) << fetched;
  const int64_t prompt = first["usage"]["prompt_tokens"];
  EXPECT_EQ(fetched["usage"]["prompt_tokens_details"]["cached_tokens"], (prompt - 1) / 64 * 64) << fetched;
  const json missing = server.post("/v1/chat/completions", ask("tiny-vision", pages.url("/dog.png")), 400);
  EXPECT_EQ(missing["error"]["message"], "messages: image 0 url: expected a URL that answers 200, found status 404") << missing;
  EXPECT_EQ(server.post("/v1/chat/completions", ask("tiny-vision", pages.url("/cat.png")))["choices"].size(), 1u);
}

// A model without a vision tower refuses image parts (fixture v41-tiny).
TEST_F(ServerImages, ATextOnlyModelRefusesImages) {
  test::RunningServer server(ServerOptions{});
  const json r = server.post("/v1/chat/completions", ask("v41-tiny", data_url(png(40, 40, 5))), 400);
  EXPECT_EQ(r["error"]["message"], "messages: expected no image parts for a model without a vision tower (v41-tiny), found 1") << r;
}

// The official openai npm client (tests/e2e, installed by scripts/setup-e2e.sh) sends an image.
TEST_F(ServerImages, OpenAiClientSendsAnImage) {
  test::RunningServer server(options());
  const std::string file = (*dir_ / "picture.png").string();
  const std::vector<uint8_t> bytes = png(90, 130, 6);
  std::ofstream(file, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  const std::string cmd = std::string("node ") + DSV41_SOURCE_DIR + "/tests/e2e/images.mjs --base-url http://127.0.0.1:" +
                          std::to_string(server.port()) + " --model tiny-vision --image " + file + " > /dev/null";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

}  // namespace
}  // namespace dsv41
