#include "server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "base/error.h"

namespace dsv41 {

void Counter::inc(double amount) {
  if (!(amount >= 0)) fail("Counter::inc", "an amount >= 0 (counters only go up)", std::to_string(amount));
  value_.fetch_add(amount, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]))
      fail("histogram bucket " + std::to_string(i), "a finite upper bound (+Inf is implicit)", std::to_string(bounds_[i]));
    if (i > 0 && !(bounds_[i] > bounds_[i - 1]))
      fail("histogram bucket " + std::to_string(i), "a bound above the previous one (" + std::to_string(bounds_[i - 1]) + ")",
           std::to_string(bounds_[i]));
  }
}

void Histogram::observe(double v) {
  // The first bucket whose bound is >= v ("le" is inclusive); NaN and values above every bound
  // land in +Inf.
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  std::lock_guard lock(mutex_);
  ++counts_[i];
  sum_ += v;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (uint64_t c : counts_) s.cumulative.push_back(running += c);
  s.count = running;
  s.sum = sum_;
  return s;
}

namespace {

bool valid_name(const std::string& name, bool colons) {
  if (name.empty()) return false;
  auto head = [&](char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || (colons && c == ':'); };
  if (!head(name[0])) return false;
  return std::all_of(name.begin() + 1, name.end(),
                     [&](char c) { return head(c) || std::isdigit(static_cast<unsigned char>(c)); });
}

// Exposition-format escapes: HELP text escapes backslash and newline; label values also the
// double quote.
std::string escape(const std::string& s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '"' && quote) out += "\\\"";
    else out += c;
  }
  return out;
}

// Integral values print as integers (token counts read better as 1000000 than as 1e+06); others
// in the shortest form that reads back exactly.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, end);
}

std::string label_text(const Labels& labels) {
  std::string out;
  for (const auto& [name, value] : labels) out += (out.empty() ? "" : ",") + name + "=\"" + escape(value, true) + "\"";
  return out;
}

std::string braces(const std::string& labels) { return labels.empty() ? "" : "{" + labels + "}"; }

const char* type_name(int type) {
  static const char* const kNames[] = {"counter", "gauge", "histogram"};
  return kNames[type];
}

}  // namespace

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help, Type type,
                                                 const Labels& labels, const std::vector<double>& bounds) {
  if (!valid_name(name, true)) fail("metric name", "[a-zA-Z_:][a-zA-Z0-9_:]*", "\"" + name + "\"");
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const auto& [label, value] : labels) {
    if (!valid_name(label, false) || label.starts_with("__"))
      fail(name + " label name", "[a-zA-Z_][a-zA-Z0-9_]* not starting with __", "\"" + label + "\"");
    if (type == Type::Histogram && label == "le") fail(name + " label name", "any name but le (histograms use it)", "le");
    if (!seen.insert(label).second) fail(name + " labels", "each label name once", "\"" + label + "\" twice");
    names.push_back(label);
  }
  auto [it, added] = families_.try_emplace(name, Family{type, help, names, bounds, {}, {}, {}});
  Family& f = it->second;
  if (added) return f;
  if (f.type != type)
    fail(name, std::string("a ") + type_name(static_cast<int>(f.type)) + " (as first registered)",
         std::string("a ") + type_name(static_cast<int>(type)));
  if (f.help != help) fail(name + " help", "\"" + f.help + "\" (as first registered)", "\"" + help + "\"");
  if (f.label_names != names) {
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (const auto& n : v) s += (s.empty() ? "" : ",") + n;
      return "[" + s + "]";
    };
    fail(name + " label names", list(f.label_names) + " (as first registered)", list(names));
  }
  if (f.bounds != bounds) fail(name + " buckets", "the buckets it was first registered with", "different buckets");
  return f;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::Counter, labels, {}).counters[label_text(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return *slot;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard lock(mutex_);
  auto& slot = family(name, help, Type::Gauge, labels, {}).gauges[label_text(labels)];
  if (!slot) slot = std::make_unique<Gauge>();
  return *slot;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard lock(mutex_);
  // Built before the family is touched, so that invalid bounds leave the registry unchanged.
  auto fresh = std::make_unique<Histogram>(bounds);
  auto& slot = family(name, help, Type::Histogram, labels, bounds).histograms[label_text(labels)];
  if (!slot) slot = std::move(fresh);
  return *slot;
}

std::string MetricsRegistry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + escape(f.help, false) + "\n";
    out += "# TYPE " + name + " " + type_name(static_cast<int>(f.type)) + "\n";
    for (const auto& [labels, c] : f.counters) out += name + braces(labels) + " " + format_value(c->value()) + "\n";
    for (const auto& [labels, g] : f.gauges) out += name + braces(labels) + " " + format_value(g->value()) + "\n";
    for (const auto& [labels, h] : f.histograms) {
      const Histogram::Snapshot s = h->snapshot();
      const std::string sep = labels.empty() ? "" : ",";
      for (size_t i = 0; i <= s.bounds.size(); ++i) {
        const std::string le = i < s.bounds.size() ? format_value(s.bounds[i]) : "+Inf";
        out += name + "_bucket{" + labels + sep + "le=\"" + le + "\"} " + std::to_string(s.cumulative[i]) + "\n";
      }
      out += name + "_sum" + braces(labels) + " " + format_value(s.sum) + "\n";
      out += name + "_count" + braces(labels) + " " + std::to_string(s.count) + "\n";
    }
  }
  return out;
}

}  // namespace dsv41
