#include "server/access_log.h"

#include <cmath>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

namespace dsv41 {

namespace {

// UTC, millisecond precision, as RFC 3339.
std::string utc(int64_t unix_ms) {
  const std::time_t s = std::time_t(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&s, &tm);
  char buf[40];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03dZ", int(unix_ms % 1000));
  return buf;
}

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fms", v);
  return buf;
}

double tenths(double v) { return std::round(v * 10) / 10; }

}  // namespace

std::string access_line(LogFormat format, const AccessEntry& e) {
  const bool generation = e.prompt_tokens >= 0;
  if (format == LogFormat::Off) return {};
  if (format == LogFormat::Json) {
    nlohmann::ordered_json j = {{"time", utc(e.unix_ms)}, {"remote", e.remote}, {"method", e.method},
                                {"path", e.path},         {"status", e.status}};
    if (generation) {
      j["prompt_tokens"] = e.prompt_tokens;
      j["cached_tokens"] = e.cached_tokens;
      j["output_tokens"] = e.output_tokens;
      if (e.ttft_ms >= 0) j["ttft_ms"] = tenths(e.ttft_ms);
    }
    j["duration_ms"] = tenths(e.duration_ms);
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  std::string line = utc(e.unix_ms) + " " + e.remote + " " + e.method + " " + e.path + " " + std::to_string(e.status);
  if (generation) {
    line += " prompt=" + std::to_string(e.prompt_tokens) + " cached=" + std::to_string(e.cached_tokens) +
            " output=" + std::to_string(e.output_tokens);
    if (e.ttft_ms >= 0) line += " ttft=" + ms(e.ttft_ms);
  }
  return line + " " + ms(e.duration_ms);
}

}  // namespace dsv41
