#pragma once
// `dsv41 serve` in a child process (the CLI's tests, and engines as separate processes in the
// tiers' tests). DSV41_BINARY names the dsv41 under test (tests/CMakeLists.txt).
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

namespace dsv41::test {

// `dsv41 serve --port 0 ARGS` in a child process under `env` ("NAME=value ..."): its port is read
// from the line it prints ("listening on http://127.0.0.1:PORT"); SIGTERM stops it at the end.
class ServeProcess {
 public:
  ServeProcess(const std::string& args, const std::string& env) {
    int out[2];
    if (::pipe(out) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], 1), ::dup2(out[1], 2), ::close(out[0]), ::close(out[1]);
      const std::string cmd = env + " exec " + DSV41_BINARY + " serve --port 0 " + args;
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), nullptr);
      ::_exit(127);
    }
    ::close(out[1]);
    out_ = ::fdopen(out[0], "r");
    const char* marker = "listening on http://127.0.0.1:";
    char line[4096];
    while (std::fgets(line, sizeof line, out_)) {
      output_ += line;
      if (const char* at = std::strstr(line, marker)) {
        port_ = std::atoi(at + std::strlen(marker));
        break;
      }
    }
  }
  ~ServeProcess() { stop(); }
  int port() const { return port_; }
  // Stops it (SIGTERM) and returns all it printed and its exit status.
  std::pair<int, std::string> stop() {
    if (pid_ <= 0) return {status_, output_};
    if (port_ > 0) ::kill(pid_, SIGTERM);
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, out_)) > 0) output_.append(buf, n);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    std::fclose(out_);
    pid_ = -1;
    status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return {status_, output_};
  }
  // GET `path` once the model has loaded (/health 200), with `key` as the bearer token if set.
  int get(const std::string& path, const std::string& key) const {
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 2000; ++i) {
      auto h = c.Get("/health");
      if (h && h->status == 200) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    httplib::Headers headers;
    if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
    auto r = c.Get(path, headers);
    return r ? r->status : -1;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int port_ = 0, status_ = -1;
  std::string output_;
};

}  // namespace dsv41::test
