#pragma once
// Patterns of tokenizer.json (`{"Regex": ...}` or `{"String": ...}`), found in text.
//
// Regexes are compiled by PCRE2 with PCRE2_UTF | PCRE2_UCP (so \s, \w, \d and \p{..} are
// Unicode-aware, as in the Oniguruma engine HF tokenizers uses) and PCRE2_MULTILINE (^ and $
// are line anchors, as in Oniguruma), and JIT-compiled where PCRE2 supports it. Matching follows HF's iteration: leftmost matches, left to right, never
// overlapping, and an empty match right after the previous match is skipped.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv41 {

struct Match {
  size_t begin, end;  // byte offsets, end exclusive
};

class Regex {
 public:
  // `where` names the component in errors, e.g. "tokenizer.json: pre_tokenizer.pretokenizers[0]".
  Regex(std::string_view pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends every match in `text` (valid UTF-8) to `out`.
  void find_all(std::string_view text, std::vector<Match>& out) const;

 private:
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

// A Split/Replace pattern: a literal string or a regex.
class Pattern {
 public:
  // From `{"String": s}` or `{"Regex": r}`.
  static Pattern from_json(const nlohmann::json& spec, const std::string& where);

  void find_all(std::string_view text, std::vector<Match>& out) const;
  // `text` with every match replaced by `content`.
  std::string replace_all(std::string_view text, std::string_view content) const;

 private:
  std::string literal_;
  std::shared_ptr<const Regex> regex_;  // null for a literal
};

}  // namespace dsv41
