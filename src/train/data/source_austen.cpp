// Jane Austen's six novels, as the R package janeaustenr stores them (one string per line).
#include <regex>

#include "train/data/sources.h"

namespace dsv41::train {

std::vector<Document> parse_austen(std::string_view novel, const std::vector<std::string>& lines) {
  static const std::regex chapter(R"((CHAPTER|Chapter) ([0-9]+|[IVXLC]+)\.?)");
  static const std::regex left_out(R"(VOLUME [IVX]+\.?|THE END\.?|FINIS\.?|Finis\.?)");
  std::vector<Document> docs;
  docs.push_back({"austen", std::string(novel) + "/0", ""});
  for (const std::string& line : lines) {
    if (std::regex_match(line, chapter)) {
      docs.push_back({"austen", std::string(novel) + "/" + std::to_string(docs.size()), ""});
      continue;
    }
    if (std::regex_match(line, left_out)) continue;
    docs.back().text += line;
    docs.back().text += '\n';
  }
  return docs;
}

}  // namespace dsv41::train
