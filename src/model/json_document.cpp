#include "model/json_document.h"

#include <unordered_set>
#include <vector>

#include "base/error.h"

namespace dsv41 {

using json = nlohmann::json;

json parse_json(std::string_view text, const std::string& where) {
  // The keys seen so far in the object open at each depth (nlohmann reports an object's start at
  // its parent's depth and its keys at its own).
  std::vector<std::unordered_set<std::string>> keys;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (depth >= kJsonDepth)
        fail(where, "valid JSON nested at most " + std::to_string(kJsonDepth) + " levels deep", "deeper nesting");
      if (event == json::parse_event_t::object_start) {
        if (keys.size() < size_t(depth) + 2) keys.resize(size_t(depth) + 2);
        keys[size_t(depth) + 1].clear();
      }
    } else if (event == json::parse_event_t::key && !keys[size_t(depth)].insert(parsed.get<std::string>()).second) {
      fail(where, "valid JSON with each key once in an object", "key " + json(parsed.get<std::string>()).dump() + " twice");
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    fail(where, "valid JSON", e.what());
  }
}

}  // namespace dsv41
