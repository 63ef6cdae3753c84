#pragma once
// A server in a thread of this process on fixture v41-tiny, unless the options name another model
// (on the test device), listening on a free port, healthy when the constructor returns; stopped by
// the destructor. The server tests' and the chat page's.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "fixture.h"
#include "server/server.h"
#include "test_device.h"

namespace dsv41::test {

class RunningServer {
 public:
  explicit RunningServer(ServerOptions options) {
    if (options.model_dir.empty()) options.model_dir = fixture_dir("v41-tiny");
    options.device = test_device();
    options.ranks = test_ranks();
    options.port = 0;
    options.on_listening = [this](int port) { port_.store(port); };
    server_ = std::make_unique<Server>(options);
    thread_ = std::thread([this] { server_->run(); });
    while (port_.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    httplib::Client c = client();
    for (int i = 0; i < 2000; ++i) {
      auto r = c.Get("/health");
      if (r && r->status == 200) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ADD_FAILURE() << "the server never became healthy";
  }
  ~RunningServer() {
    server_->stop();
    thread_.join();
  }
  int port() const { return port_.load(); }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(120, 0);
    return c;
  }
  nlohmann::json post(const std::string& path, const nlohmann::json& body, int expect = 200) const {
    auto r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, expect) << r->body;
    return nlohmann::json::parse(r->body);
  }
  // The value of the /metrics line that starts with `line_start` and a space.
  double metric(const std::string& line_start) const {
    auto r = client().Get("/metrics");
    std::istringstream in(r->body);
    for (std::string line; std::getline(in, line);)
      if (line.rfind(line_start + " ", 0) == 0) return std::stod(line.substr(line_start.size() + 1));
    ADD_FAILURE() << "no metric " << line_start;
    return -1;
  }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::atomic<int> port_{0};
};

}  // namespace dsv41::test
