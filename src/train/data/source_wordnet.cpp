// WordNet 3.0's data files (Debian wordnet-base), wndb(5WN): after a licence header (lines that
// start with two spaces), one synset per line:
//   offset lex_filenum ss_type w_cnt (word lex_id){w_cnt} p_cnt (pointer){p_cnt} [frames] | gloss
// w_cnt is two hexadecimal digits; a word's spaces are underscores, and an adjective may carry a
// syntactic marker "(a)", "(p)" or "(ip)".
#include <sstream>

#include "base/error.h"
#include "train/data/sources.h"
#include "train/data/text_lines.h"

namespace dsv41::train {

namespace {

std::string lemma(std::string word) {
  for (const char* marker : {"(a)", "(p)", "(ip)"})
    if (word.ends_with(marker)) word.resize(word.size() - std::string_view(marker).size());
  for (char& c : word)
    if (c == '_') c = ' ';
  return word;
}

}  // namespace

std::vector<Document> parse_wordnet(std::string_view data, std::string_view pos) {
  std::vector<Document> docs;
  std::string lexfile;  // of the synsets in docs.back()
  int in_doc = 0;
  for (std::string_view line : split_lines(data)) {
    if (line.starts_with("  ") || line.empty()) continue;
    const std::string where = "WordNet " + std::string(pos) + " synset \"" + std::string(line.substr(0, 40)) + "...\"";
    const size_t bar = line.find(" | ");
    if (bar == std::string_view::npos) fail(where, "a synset with a gloss after \" | \"", "none");
    std::istringstream fields{std::string(line.substr(0, bar))};
    std::string offset, lex, type, count;
    fields >> offset >> lex >> type >> count;
    int words = 0;
    try {
      words = std::stoi(count, nullptr, 16);
    } catch (const std::exception&) {
      fail(where, "a hexadecimal word count", "\"" + count + "\"");
    }
    std::string lemmas;
    for (int i = 0; i < words; ++i) {
      std::string word, lex_id;
      if (!(fields >> word >> lex_id)) fail(where, std::to_string(words) + " words", "fewer");
      lemmas += (i ? ", " : "") + lemma(word);
    }
    std::string_view gloss = line.substr(bar + 3);
    while (!gloss.empty() && gloss.back() == ' ') gloss.remove_suffix(1);
    if (docs.empty() || lex != lexfile || in_doc == kWordnetSynsetsPerDocument) {
      docs.push_back({"wordnet", std::string(pos) + "/" + offset, ""});
      lexfile = lex;
      in_doc = 0;
    }
    docs.back().text += lemmas + " (" + std::string(pos) + "): " + std::string(gloss) + "\n";
    ++in_doc;
  }
  return docs;
}

}  // namespace dsv41::train
