#pragma once
// Small helpers shared by the tests: reading a file whole, a fresh temporary directory that is
// removed when the test ends, running the dsv41 command, views of KV block payloads, and (error_of.h)
// the message of a thrown error.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <cstdint>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "error_of.h"

namespace dsv41::test {

// Payloads made by global_block(), as restore_sequence takes them.
inline std::vector<std::span<const uint8_t>> payloads(const std::vector<std::vector<uint8_t>>& blocks) {
  return {blocks.begin(), blocks.end()};
}

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A directory of its own under the system temp dir, unique per process and per instance; not
// created, so that writers that refuse an existing checkpoint directory can be tested.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("dsv41_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string string() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct Outcome {
  int status;
  std::string output;  // stdout and stderr together
};

// Runs `dsv41 ARGS` through the shell (so ARGS may redirect) and collects what it prints; `env`
// ("NAME=value ...") is set for the command alone.
inline Outcome run_dsv41(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + (env.empty() ? "" : " ") + std::string(DSV41_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace dsv41::test
