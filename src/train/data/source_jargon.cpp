// The Jargon File 4.4.7 as Debian's jargon-text ships it (jargon.txt.gz): a table of contents,
// chapters ("Chapter 1. ..." at column 0, text indented by 3), the glossary (entries
// "   :term: ...", each letter's entries followed by "  B" and an index of the next letter's
// terms), then appendices with sections (headings at column 0). Chapter 3 has a table drawn
// at column 0 with box-drawing characters.
#include <algorithm>

#include "train/data/sources.h"
#include "train/data/text_lines.h"

namespace dsv41::train {

namespace {

// Cross-references are written {term}: the braces go.
std::string without_braces(std::string_view line) {
  std::string out;
  for (char c : line)
    if (c != '{' && c != '}') out += c;
  return out;
}

}  // namespace

std::vector<Document> parse_jargon(std::string_view text) {
  enum class Part { contents, section, glossary } part = Part::contents;
  std::vector<Document> docs;
  bool in_entry = false;  // in the glossary: inside an entry (not a letter's term index)
  for (std::string_view line : split_lines(text)) {
    // The revision-history table, drawn with box-drawing characters (U+2500..U+257F), is left out.
    if (line.starts_with("\xE2\x94") || line.starts_with("\xE2\x95")) continue;
    const size_t indent = indent_of(line);
    if (!line.empty() && indent == 0) {  // a heading at column 0
      if (line == "Glossary") {
        part = Part::glossary;
        in_entry = false;
      } else {
        part = Part::section;
        docs.push_back({"jargon", std::string(line), std::string(line) + "\n\n"});
      }
      continue;
    }
    if (part == Part::contents) continue;
    if (part == Part::glossary) {
      const size_t colon = line.find(':', 4);
      if (indent == 3 && line.size() > 4 && line[3] == ':' && colon != std::string_view::npos) {
        const std::string term(line.substr(4, colon - 4));
        docs.push_back({"jargon", term, term + ":" + without_braces(line.substr(colon + 1)) + "\n"});
        in_entry = true;
        continue;
      }
      if (indent == 2 && indent < line.size()) in_entry = false;  // "  B": a letter's index follows
      if (!in_entry) continue;
    }
    docs.back().text += without_braces(line.substr(std::min<size_t>(indent, 3)));  // the text's own indentation
    docs.back().text += '\n';
  }
  return docs;
}

}  // namespace dsv41::train
