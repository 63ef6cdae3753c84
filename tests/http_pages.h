#pragma once
// An HTTP server in a thread of this process on 127.0.0.1 (any free port) with the routes a test
// gives it, for the server's fetching of image URLs; stopped by the destructor.
#include <httplib.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace dsv41::test {

class HttpPages {
 public:
  explicit HttpPages(const std::function<void(httplib::Server&)>& routes) {
    routes(server_);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~HttpPages() {
    server_.stop();
    thread_.join();
  }
  std::string url(const std::string& path) const { return "http://127.0.0.1:" + std::to_string(port_) + path; }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace dsv41::test
