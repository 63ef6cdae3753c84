#pragma once
// Added tokens (tokenizer.json "added_tokens"): strings that are cut out of the input before
// normalization and pre-tokenization and encoded as their own id. Matching is leftmost-longest
// and never overlapping; `single_word` keeps only matches not inside a word, `lstrip`/`rstrip`
// swallow the whitespace on that side, and `normalized` tokens are matched on the normalized
// text (the others on the raw text). `special` tokens are the ones decode may skip.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dsv41 {

struct AddedToken {
  int id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Finds a set of added tokens in text, with a byte trie.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns);

  // Cuts `text` into consecutive segments, calling on_text(begin, end) for plain text and
  // on_token(id) for each added token found (stripped whitespace belongs to the token).
  void split(std::string_view text, const std::function<void(size_t, size_t)>& on_text,
             const std::function<void(int)>& on_token) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int>> children;  // sorted by byte
    int token = -1;                                        // index into tokens_ of a token ending here
  };
  int child(int node, unsigned char byte) const;
  // The longest token starting at `pos`: its index and length, or -1.
  int longest_at(std::string_view text, size_t pos, size_t& length) const;

  std::vector<Node> nodes_;
  std::vector<AddedToken> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace dsv41
