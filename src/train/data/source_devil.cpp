// Ambrose Bierce's The Devil's Dictionary (1911) in dictd's format (Debian dict-devil): the
// .index has one line per headword, "word<TAB>offset<TAB>length", the numbers in base 64
// (A-Z a-z 0-9 + /, most significant digit first), pointing into the .dict text.
#include <map>
#include <set>

#include "base/error.h"
#include "train/data/sources.h"
#include "train/data/text_lines.h"

namespace dsv41::train {

namespace {

size_t base64_number(std::string_view digits, const std::string& where) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t v = 0;
  for (char c : digits) {
    const size_t d = kAlphabet.find(c);
    if (d == std::string_view::npos) fail(where, "a base-64 number", "\"" + std::string(digits) + "\"");
    v = v * 64 + d;
  }
  return v;
}

}  // namespace

std::vector<Document> parse_devil(std::string_view dict, std::string_view index) {
  std::vector<Document> docs;
  std::set<size_t> offsets;  // several headwords may point to one entry
  std::map<std::string, int, std::less<>> entries_of;  // a headword may have several entries
  for (std::string_view line : split_lines(index)) {
    const std::string where = "dictd index line \"" + std::string(line) + "\"";
    const size_t tab1 = line.find('\t'), tab2 = line.find('\t', tab1 + 1);
    if (tab1 == std::string_view::npos || tab2 == std::string_view::npos) fail(where, "word, offset and length", "fewer fields");
    const std::string_view word = line.substr(0, tab1);
    if (word.starts_with("00database")) continue;
    const size_t offset = base64_number(line.substr(tab1 + 1, tab2 - tab1 - 1), where);
    const size_t length = base64_number(line.substr(tab2 + 1), where);
    if (offset > dict.size() || length > dict.size() - offset)
      fail(where, "an entry inside the " + std::to_string(dict.size()) + "-byte dictionary", "bytes " + std::to_string(offset) + "+" + std::to_string(length));
    if (!offsets.insert(offset).second) continue;
    const int n = ++entries_of[std::string(word)];
    docs.push_back({"devil", std::string(word) + (n > 1 ? " #" + std::to_string(n) : ""), std::string(dict.substr(offset, length))});
  }
  return docs;
}

}  // namespace dsv41::train
