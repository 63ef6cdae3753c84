#include "server/stop_strings.h"

#include <algorithm>

namespace dsv41 {

std::string StopStrings::push(std::string_view piece) {
  if (stopped_) return {};
  held_ += piece;
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::flush() {
  std::string out = stopped_ ? std::string() : held_;
  held_.clear();
  return out;
}

}  // namespace dsv41
