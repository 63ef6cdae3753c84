// The chat page served at / in headless Chromium (Debian's chromium, installed by scripts/setup.sh):
// a server in this process with fixture v41-tiny and an API key, driven by tests/web/chat_page.mjs
// through the page as a user would (the key, two answers, reasoning, stop). Chromium is required,
// as node is for the e2e scripts: without it the script fails, and so does this test.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "../running_server.h"
#include "../test_util.h"

using namespace dsv41;

namespace {

constexpr const char* kKey = "web-chat-test-key";

// A server in this process with the API key.
test::RunningServer with_key() {
  ServerOptions options;
  options.api_key = kKey;
  return test::RunningServer(options);
}

}  // namespace

// The page is served without the key (it holds nothing; its API requests carry the key).
TEST(WebChat, ThePageIsServedWithoutTheKey) {
  const test::RunningServer server = with_key();
  for (const char* path : {"/", "/index.html"}) {
    auto r = server.client().Get(path);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 200) << path;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8") << path;
    EXPECT_NE(r->body.find("<title>dsv41 chat</title>"), std::string::npos) << path;
  }
  EXPECT_EQ(server.client().Get("/v1/models")->status, 401);
  EXPECT_EQ(server.client().Post("/index.html", "", "text/plain")->status, 405);
}

// Chromium chats through the page; the reply it stopped was cancelled on the server. The
// screenshot is the one docs/server.md shows (docs/web-chat.png; DSV41_WEB_SCREENSHOT=PATH keeps
// this run's there).
TEST(WebChat, ChromiumChatsThroughThePage) {
  const test::RunningServer server = with_key();
  test::TempDir dir("web_chat");
  std::filesystem::create_directories(dir.path());
  const char* keep = std::getenv("DSV41_WEB_SCREENSHOT");
  const std::string screenshot = keep ? keep : (dir / "web-chat.png").string();
  const std::string cmd = "node " + (std::filesystem::path(DSV41_SOURCE_DIR) / "tests/web/chat_page.mjs").string() +
                          " --base-url http://127.0.0.1:" + std::to_string(server.port()) + " --model v41-tiny --api-key " + kKey +
                          " --screenshot " + screenshot;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  EXPECT_EQ(test::read_text(screenshot).substr(1, 3), "PNG");
  // The stopped reply: the server saw its client go and cancelled it.
  for (int i = 0; i < 100 && server.metric("dsv41_requests_cancelled_total") < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(server.metric("dsv41_requests_cancelled_total"), 1);
}
