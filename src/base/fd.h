#pragma once
// Owns a POSIX file descriptor; close() reports the error that a destructor would have to drop.
#include <unistd.h>

#include <utility>

namespace dsv41 {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  int close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

}  // namespace dsv41
