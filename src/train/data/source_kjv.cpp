// The King James Bible, as bible(1) (Debian bible-kjv, data from bible-kjv-text) prints it.
#include "base/error.h"
#include "train/data/sources.h"
#include "train/data/text_lines.h"

namespace dsv41::train {

std::vector<Document> parse_kjv(std::string_view bible_output) {
  std::vector<Document> docs;
  for (std::string_view line : split_lines(bible_output)) {
    if (line.empty()) continue;
    if (line.front() != ' ') {  // a chapter heading, "Genesis 1"
      docs.push_back({"kjv", std::string(line), std::string(line) + "\n\n"});
      continue;
    }
    // A verse, "  12 text": the number is dropped.
    const size_t digits = line.find_first_not_of(' ');
    const size_t text = line.find_first_not_of("0123456789", digits);
    if (docs.empty() || text == digits || text == std::string_view::npos || line[text] != ' ')
      fail("bible output, line \"" + std::string(line) + "\"", "a chapter heading, then verses \"  N text\"", "this line");
    Document& d = docs.back();
    if (d.text.back() != '\n') d.text += '\n';
    d.text += line.substr(text + 1);
  }
  return docs;
}

}  // namespace dsv41::train
