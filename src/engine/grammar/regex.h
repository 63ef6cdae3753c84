#pragma once
// Regular expressions as JSON Schema's `pattern` writes them (ECMA-262 syntax), the common
// subset: literals, `.`, classes `[a-z0-9_]` and `[^...]`, escapes \d \D \w \W \s \S \t \n \r
// \f \v and escaped punctuation, groups `(...)` and `(?:...)`, alternation `|`, quantifiers
// `*` `+` `?` `{m}` `{m,}` `{m,n}` (a lazy `?` after one changes nothing here: only the
// language matters), and the anchors `^` first and `$` last. Anything else (backreferences,
// lookaround, \b, classes of non-ASCII characters) is refused, naming it and its position.
//
// A pattern matches anywhere in a string (JSON Schema's rule): without `^` any text may come
// before the match, without `$` any after it; each of the pattern's top-level alternatives has
// its own anchors, as in ECMAScript ("^a|b$"). Characters are matched as UTF-8: `.` and
// negated classes take any well-formed multi-byte character too.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/nfa.h"

namespace dsv41::grammar {

// Every well-formed UTF-8 sequence of 2 to 4 bytes (no overlong forms, no surrogates).
Fragment utf8_multibyte(Nfa& nfa);

class Regex {
 public:
  // Throws dsv41::Error naming what was found where.
  static Regex parse(std::string_view pattern);

  // The pattern's strings as a fragment of `nfa`, over the single bytes in `ascii` (the
  // characters a context allows: a JSON string's unescaped ones, say) and multi-byte
  // characters; the unanchored ends as any number of such characters.
  Fragment emit(Nfa& nfa, const ByteSet& ascii) const;

  struct Node;

 private:
  struct Branch {
    std::shared_ptr<const Node> node;
    bool anchored_start = false, anchored_end = false;
  };
  std::vector<Branch> branches_;  // the top-level alternatives
};

}  // namespace dsv41::grammar
