#pragma once
// The progress line of the commands' long jobs (loading a model, writing a checkpoint, the
// benchmarks, building training data): "<what> [##########..........] <done>/<total>" on stderr,
// redrawn in place as it changes, and only when stderr is a terminal — a log or a pipe gets none
// of it. Lines a job prints to stderr meanwhile go through line(), above the bar.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace dsv41::cli {

bool stderr_is_terminal();

class Progress {
 public:
  enum class Unit { Count, Bytes };
  // Draws nothing unless `shown`. With `elapsed`, the line also shows the seconds the current step
  // has taken, redrawn every second: for a step that reports nothing while it runs (placing a
  // model's weights on a device).
  explicit Progress(bool shown = stderr_is_terminal(), bool elapsed = false);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `what` at `done` of `total` (total 0: not known yet, "..." in place of the bar). A new `what`
  // or count starts a new step for the elapsed seconds. Safe from any thread.
  void update(const std::string& what, int64_t done, int64_t total, Unit unit = Unit::Count);
  // A line of its own on stderr, the bar redrawn under it.
  void line(const std::string& text);
  // The bar erased (the terminal's line blank again), until the next update.
  void clear();

 private:
  std::string text() const;  // the line as drawn now
  void draw();               // under mutex_
  void erase();              // under mutex_

  const bool shown_, elapsed_;
  std::mutex mutex_;
  std::string what_;
  int64_t done_ = 0, total_ = 0;
  Unit unit_ = Unit::Count;
  std::chrono::steady_clock::time_point step_start_;
  size_t drawn_ = 0;  // characters of the line on the terminal (0: none)
  std::string last_;  // and the line
  std::string drawn_what_;  // its step
  std::chrono::steady_clock::time_point drawn_at_;
  bool active_ = false;
  bool stopping_ = false;
  std::condition_variable wake_;
  std::thread ticker_;
};

}  // namespace dsv41::cli
