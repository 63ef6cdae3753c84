#include "cli/progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace dsv41::cli {

bool stderr_is_terminal() { return isatty(STDERR_FILENO) == 1; }

Progress::Progress(bool shown, bool elapsed) : shown_(shown), elapsed_(elapsed) {
  if (!shown_ || !elapsed_) return;
  ticker_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::seconds(1), [&] { return stopping_; }))
      if (active_) draw();
  });
}

Progress::~Progress() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (ticker_.joinable()) ticker_.join();
  clear();
}

void Progress::update(const std::string& what, int64_t done, int64_t total, Unit unit) {
  if (!shown_) return;
  std::lock_guard lock(mutex_);
  if (what != what_ || done != done_ || !active_) step_start_ = std::chrono::steady_clock::now();
  what_ = what, done_ = done, total_ = total, unit_ = unit;
  active_ = true;
  draw();
}

void Progress::line(const std::string& text) {
  std::lock_guard lock(mutex_);
  erase();
  fmt::print(stderr, "{}\n", text);
  if (active_) draw();
  std::fflush(stderr);
}

void Progress::clear() {
  std::lock_guard lock(mutex_);
  erase();
  active_ = false;
}

std::string Progress::text() const {
  constexpr int kWidth = 30;
  const int64_t done = std::clamp<int64_t>(done_, 0, std::max<int64_t>(total_, 0));
  const int filled = total_ > 0 ? int(kWidth * done / total_) : 0;
  const std::string bar = std::string(size_t(filled), '#') + std::string(size_t(kWidth - filled), '.');
  std::string count = "...";
  if (total_ > 0 && unit_ == Unit::Count) count = fmt::format("{}/{}", done_, total_);
  if (total_ > 0 && unit_ == Unit::Bytes) {
    const bool gb = total_ >= 1'000'000'000;
    const double scale = gb ? 1e9 : 1e6;
    count = fmt::format("{:.2f}/{:.2f} {}", double(done_) / scale, double(total_) / scale, gb ? "GB" : "MB");
  }
  std::string line = fmt::format("{} [{}] {}", what_, bar, count);
  if (elapsed_) {
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - step_start_).count();
    line += fmt::format(" {} s", seconds);
  }
  return line;
}

void Progress::draw() {
  if (!shown_) return;
  // A job may report far more often than a terminal needs: a step's line at most ten times a
  // second, and its last count always.
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ > 0 && what_ == drawn_what_ && done_ < total_ && now - drawn_at_ < std::chrono::milliseconds(100)) return;
  const std::string line = text();
  if (drawn_ > 0 && line == last_) return;
  drawn_at_ = now;
  drawn_what_ = what_;
  // Padded over what a longer line before it left on the terminal.
  fmt::print(stderr, "\r{:<{}}", line, std::max(line.size(), drawn_));
  std::fflush(stderr);
  drawn_ = line.size();
  last_ = line;
}

void Progress::erase() {
  if (drawn_ == 0) return;
  fmt::print(stderr, "\r{:<{}}\r", "", drawn_);
  std::fflush(stderr);
  drawn_ = 0;
}

}  // namespace dsv41::cli
