#pragma once
// An injectable clock for the KV tiers. Lifetime and TTL policies (the persistent store's
// guaranteed lifetime, the host cache's and SWA pool's TTLs) read time only through this
// interface, so that tests can drive hours of policy in microseconds with a ManualClock.
#include <atomic>
#include <chrono>
#include <cstdint>

namespace dsv41 {

struct Clock {
  virtual ~Clock() = default;
  // Milliseconds since the Unix epoch. Wall-clock (not steady) time, because the persistent
  // store writes it into files that must stay meaningful across restarts of the process.
  virtual int64_t now_ms() const = 0;
};

// The real time.
struct SystemClock final : Clock {
  int64_t now_ms() const override {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // One shared instance: the default for every component that is not given a clock.
  static const SystemClock& instance() {
    static const SystemClock clock;
    return clock;
  }
};

// A clock that moves only when told to. Atomic so that a test may advance it while another
// thread reads it.
struct ManualClock final : Clock {
  explicit ManualClock(int64_t start_ms = 0) : ms_(start_ms) {}
  int64_t now_ms() const override { return ms_.load(std::memory_order_relaxed); }
  void set_ms(int64_t ms) { ms_.store(ms, std::memory_order_relaxed); }
  void advance_ms(int64_t ms) { ms_.fetch_add(ms, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> ms_;
};

}  // namespace dsv41
