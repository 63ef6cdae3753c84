#include "model/tokenizer/added_tokens.h"

#include <algorithm>

#include "model/tokenizer/unicode.h"

namespace dsv41 {

namespace {

// The code point that ends just before `pos` (text[pos - 1] is its last byte).
char32_t code_point_before(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  char32_t cp;
  unicode::decode(text, start, cp);
  return cp;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns)
    : nodes_(1), tokens_(tokens) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;  // an empty token can never be matched
    int node = 0;
    for (unsigned char b : pattern) {
      int next = child(node, b);
      if (next < 0) {
        next = int(nodes_.size());
        nodes_.push_back({});
        auto& kids = nodes_[size_t(node)].children;
        kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, 0)), {b, next});
      }
      node = next;
    }
    // Two tokens with the same text: the first one listed wins.
    if (nodes_[size_t(node)].token < 0) nodes_[size_t(node)].token = int(t);
    first_byte_[static_cast<unsigned char>(pattern[0])] = true;
  }
}

int AddedTokenMatcher::child(int node, unsigned char byte) const {
  const auto& kids = nodes_[size_t(node)].children;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(byte, 0));
  return it != kids.end() && it->first == byte ? it->second : -1;
}

int AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& length) const {
  int best = -1;
  int node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    node = child(node, static_cast<unsigned char>(text[i]));
    if (node < 0) break;
    if (nodes_[size_t(node)].token >= 0) {
      best = nodes_[size_t(node)].token;
      length = i + 1 - pos;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, const std::function<void(size_t, size_t)>& on_text,
                              const std::function<void(int)>& on_token) const {
  size_t done = 0;  // text before this offset has been handed out
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    size_t length = 0;
    int t = longest_at(text, pos, length);
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[size_t(t)];
    size_t begin = pos, end = pos + length;
    pos = end;  // a discarded match is not searched again, as with HF's match iterator
    if (token.single_word) {
      char32_t cp;
      bool word_before = begin > 0 && unicode::is_word_char(code_point_before(text, begin));
      bool word_after = end < text.size() && (unicode::decode(text, end, cp), unicode::is_word_char(cp));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      // Whitespace already handed out (e.g. swallowed by the previous token) stays there.
      while (begin > done) {
        char32_t cp = code_point_before(text, begin);
        if (!unicode::is_whitespace(cp)) break;
        begin -= cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
      }
    }
    if (token.rstrip) {
      char32_t cp;
      while (end < text.size()) {
        int n = unicode::decode(text, end, cp);
        if (!unicode::is_whitespace(cp)) break;
        end += size_t(n);
      }
      pos = end;
    }
    if (done < begin) on_text(done, begin);
    on_token(token.id);
    done = end;
  }
  if (done < text.size()) on_text(done, text.size());
}

}  // namespace dsv41
