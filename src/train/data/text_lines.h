#pragma once
// The lines of a text ("\n"-separated; a final newline ends the last line rather than starting
// an empty one), as views into it.
#include <string_view>
#include <vector>

namespace dsv41::train {

inline std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    lines.push_back(text.substr(pos, eol - pos));
    pos = eol + 1;
  }
  return lines;
}

// Leading spaces of a line.
inline size_t indent_of(std::string_view line) {
  const size_t i = line.find_first_not_of(' ');
  return i == std::string_view::npos ? line.size() : i;
}

}  // namespace dsv41::train
