#pragma once
// A small thread-safe Prometheus registry: counters, gauges and fixed-bucket histograms, rendered
// in the text exposition format 0.0.4 for GET /metrics. A metric family is a name with one HELP,
// one TYPE and one set of label names; each distinct set of label values is one series. Series
// live as long as the registry, so the references handed out may be kept and updated from any
// thread without locking the registry.
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dsv41 {

// Label name/value pairs, in the order they are rendered.
using Labels = std::vector<std::pair<std::string, std::string>>;

// The Content-Type of render()'s text.
inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

class Counter {
 public:
  // Counters only go up: a negative amount throws Error.
  void inc(double amount = 1);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void add(double amount) { value_.fetch_add(amount, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

class Histogram {
 public:
  // bounds: the finite upper bounds, strictly increasing; +Inf is implicit.
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative;  // per bound, then +Inf (== count)
    double sum = 0;
    uint64_t count = 0;
  };
  // Buckets, sum and count of one instant (an observation is in all of them or in none).
  Snapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, then +Inf; not cumulative
  double sum_ = 0;
};

class MetricsRegistry {
 public:
  // Each returns the series of this name and label values, made on first use. Asking again with
  // the same name must give the same type, help, label names (and buckets); anything else, or an
  // invalid metric or label name, throws Error.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});

  // Every family, sorted by name; within one, the series sorted by their label values.
  std::string render() const;

 private:
  enum class Type { Counter, Gauge, Histogram };
  struct Family {
    Type type;
    std::string help;
    std::vector<std::string> label_names;
    std::vector<double> bounds;  // histograms
    // key: the rendered label pairs ("" when there are none)
    std::map<std::string, std::unique_ptr<Counter>> counters;
    std::map<std::string, std::unique_ptr<Gauge>> gauges;
    std::map<std::string, std::unique_ptr<Histogram>> histograms;
  };
  Family& family(const std::string& name, const std::string& help, Type type, const Labels& labels,
                 const std::vector<double>& bounds);

  mutable std::mutex mutex_;
  std::map<std::string, Family> families_;
};

}  // namespace dsv41
