#pragma once
// A memcached server of one's own on a free loopback port (tests and benchmarks of the SWA pool on
// memcached): started by the constructor, killed by kill() or the destructor, and by the kernel if
// the process that started it dies first.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace dsv41::test {

class MemcachedProcess {
 public:
  explicit MemcachedProcess(int megabytes = 64) {
    port_ = free_port();
    pid_ = fork();
    if (pid_ == 0) {
      // It dies with its parent, whatever ends it, and keeps none of the parent's output pipes open.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int null = open("/dev/null", O_RDWR);
      dup2(null, 1), dup2(null, 2);
      const std::string port = std::to_string(port_), mb = std::to_string(megabytes);
      execlp("memcached", "memcached", "-l", "127.0.0.1", "-p", port.c_str(), "-U", "0", "-m", mb.c_str(), "-t", "1",
             "-u", "nobody", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready once it accepts a connection; or it exited (memcached missing).
    for (int i = 0; i < 500; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        error_ = "memcached did not start (exit " + std::to_string(WEXITSTATUS(status)) + "): scripts/setup.sh installs it";
        return;
      }
      if (accepts()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    error_ = "memcached on port " + std::to_string(port_) + " did not accept connections";
  }
  ~MemcachedProcess() { kill(); }
  MemcachedProcess(const MemcachedProcess&) = delete;
  MemcachedProcess& operator=(const MemcachedProcess&) = delete;

  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  int port() const { return port_; }
  const std::string& error() const { return error_; }  // empty once it serves

 private:
  static int free_port() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t n = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
    close(fd);
    return ntohs(a.sin_port);
  }
  bool accepts() const {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    close(fd);
    return ok;
  }
  int port_ = 0;
  pid_t pid_ = -1;
  std::string error_;
};

// "memcached://127.0.0.1:p1,127.0.0.1:p2,..." of the servers.
inline std::string url_of(const std::vector<std::unique_ptr<MemcachedProcess>>& servers) {
  std::string url = "memcached://";
  for (size_t i = 0; i < servers.size(); ++i) url += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(servers[i]->port());
  return url;
}

}  // namespace dsv41::test
