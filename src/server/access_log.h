#pragma once
// The access log: one line per HTTP request once its response is written (a stream's last byte
// included) — method, path, status, the client, the tokens it cost (prompt, cached, generated), its
// time to the first token and its whole time — as text for a terminal or JSON for a log pipeline
// (`dsv41 serve --log-format text|json|off`, docs/server.md).
#include <cstdint>
#include <string>

namespace dsv41 {

enum class LogFormat { Text, Json, Off };

struct AccessEntry {
  std::string method, path, remote;
  int status = 0;
  int64_t prompt_tokens = -1;  // -1: not a generation (or refused before its prompt was known)
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  double ttft_ms = -1;  // -1: no token
  double duration_ms = 0;
  int64_t unix_ms = 0;  // when it ended
};

// The entry as one line (no newline); empty for LogFormat::Off.
std::string access_line(LogFormat format, const AccessEntry& entry);

}  // namespace dsv41
