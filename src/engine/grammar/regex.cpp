#include "engine/grammar/regex.h"

#include <string>

#include "base/error.h"

namespace dsv41::grammar {

// The parsed pattern: a character set, a sequence, an alternation or a repetition.
struct Regex::Node {
  enum class Kind { chars, byte, seq, alt, repeat } kind;
  ByteSet ascii;              // chars: the ASCII bytes it takes; byte: the one byte (of a literal non-ASCII character)
  bool multibyte = false;     // chars: and any multi-byte character
  std::vector<std::shared_ptr<const Node>> parts;  // seq, alt; repeat: the one repeated
  int64_t min = 0, max = -1;  // repeat: max < 0 is no bound
};

namespace {

using Node = Regex::Node;
using NodePtr = std::shared_ptr<const Node>;

// The most a bounded quantifier may say: beyond this a pattern's automaton grows too large.
constexpr int64_t kMaxRepeat = 1000;

NodePtr chars(const ByteSet& ascii, bool multibyte) {
  auto n = std::make_shared<Node>(Node{Node::Kind::chars, ascii, multibyte, {}, 0, -1});
  return n;
}

NodePtr literal_byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return chars(s, false);
}

ByteSet range(int lo, int hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(size_t(c));
  return s;
}

ByteSet ascii_all() { return range(0, 127); }
ByteSet digits() { return range('0', '9'); }
ByteSet word() { return range('a', 'z') | range('A', 'Z') | digits() | range('_', '_'); }
ByteSet space() {
  ByteSet s;
  for (char c : std::string_view(" \t\n\r\f\v")) s.set(uint8_t(c));
  return s;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  // The top-level alternatives, each with its anchors.
  template <class Branch>
  std::vector<Branch> parse_all() {
    std::vector<Branch> branches;
    for (;;) {
      Branch b;
      if (peek('^')) ++i_, b.anchored_start = true;
      b.node = sequence();
      if (peek('$')) ++i_, b.anchored_end = true;
      branches.push_back(std::move(b));
      if (!peek('|')) break;
      ++i_;
    }
    if (i_ < p_.size()) bad(p_[i_] == ')' ? "an unmatched ')'" : "'" + std::string(1, p_[i_]) + "' here");
    return branches;
  }

 private:
  [[noreturn]] void bad(const std::string& found) const {
    fail("pattern " + std::string(p_) + " at " + std::to_string(i_), "the regex subset of docs/openai-api.md", found);
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }
  // `$` ends a top-level alternative only (before a '|' or the pattern's end).
  bool at_end() const {
    return i_ == p_.size() || p_[i_] == '|' || p_[i_] == ')' ||
           (p_[i_] == '$' && (i_ + 1 == p_.size() || p_[i_ + 1] == '|'));
  }

  NodePtr alternation() {
    std::vector<NodePtr> options{sequence()};
    while (peek('|')) ++i_, options.push_back(sequence());
    if (options.size() == 1) return options[0];
    return std::make_shared<Node>(Node{Node::Kind::alt, {}, false, std::move(options), 0, -1});
  }

  NodePtr sequence() {
    std::vector<NodePtr> parts;
    while (!at_end()) parts.push_back(quantified(atom()));
    return std::make_shared<Node>(Node{Node::Kind::seq, {}, false, std::move(parts), 0, -1});
  }

  NodePtr quantified(NodePtr n) {
    for (;;) {
      int64_t min = 0, max = -1;
      if (peek('*')) ++i_;
      else if (peek('+')) ++i_, min = 1;
      else if (peek('?')) ++i_, max = 1;
      else if (peek('{') && i_ + 1 < p_.size() && std::isdigit(uint8_t(p_[i_ + 1]))) {
        ++i_;
        min = max = number();
        if (peek(',')) {
          ++i_;
          max = peek('}') ? -1 : number();
        }
        if (!peek('}')) bad("a quantifier {m,n} without its '}'");
        ++i_;
        if (max >= 0 && max < min) bad("a quantifier {" + std::to_string(min) + "," + std::to_string(max) + "} whose max is below its min");
      } else {
        return n;
      }
      if (peek('?')) ++i_;  // lazy: the same strings
      if (peek('+')) bad("a possessive quantifier");
      n = std::make_shared<Node>(Node{Node::Kind::repeat, {}, false, {n}, min, max});
    }
  }

  int64_t number() {
    int64_t v = 0;
    if (i_ >= p_.size() || !std::isdigit(uint8_t(p_[i_]))) bad("a quantifier bound that is not a number");
    while (i_ < p_.size() && std::isdigit(uint8_t(p_[i_]))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepeat) bad("a quantifier bound above " + std::to_string(kMaxRepeat));
    }
    return v;
  }

  NodePtr atom() {
    const char c = p_[i_];
    switch (c) {
      case '(': {
        ++i_;
        if (peek('?')) {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') i_ += 2;
          else bad("a group (?" + std::string(1, i_ + 1 < p_.size() ? p_[i_ + 1] : ' ') + "...) (lookaround and named groups are not supported)");
        }
        NodePtr n = alternation();
        if (!peek(')')) bad("a group without its ')'");
        ++i_;
        return n;
      }
      case '[': return char_class();
      case '.': ++i_; {
        ByteSet s = ascii_all();
        s.reset('\n');
        return chars(s, true);
      }
      case '\\': return escape(false);
      case '*': case '+': case '?': case '{': bad("a quantifier with nothing before it");
      case '^': bad("'^' not at the pattern's start");
      case '$': bad("'$' not at the pattern's end");
      default: break;
    }
    if (uint8_t(c) < 0x80) return ++i_, literal_byte(uint8_t(c));
    // A non-ASCII character: its UTF-8 bytes in sequence.
    const size_t len = (uint8_t(c) >= 0xF0) ? 4 : (uint8_t(c) >= 0xE0) ? 3 : 2;
    if (i_ + len > p_.size()) bad("a truncated UTF-8 character");
    std::vector<NodePtr> bytes;
    for (size_t k = 0; k < len; ++k) {
      ByteSet b;
      b.set(uint8_t(p_[i_ + k]));
      bytes.push_back(std::make_shared<Node>(Node{Node::Kind::byte, b, false, {}, 0, -1}));
    }
    i_ += len;
    return std::make_shared<Node>(Node{Node::Kind::seq, {}, false, std::move(bytes), 0, -1});
  }

  // After a '\': a class escape, a control character, or escaped punctuation. In a class,
  // `negatable` escapes (\D \W \S) are refused: their complement would need the class's rest.
  NodePtr escape(bool in_class) {
    ++i_;
    if (i_ >= p_.size()) bad("a '\\' at the pattern's end");
    const char c = p_[i_++];
    switch (c) {
      case 'd': return chars(digits(), false);
      case 'w': return chars(word(), false);
      case 's': return chars(space(), false);
      case 'D': case 'W': case 'S':
        if (in_class) bad(std::string("\\") + c + " inside a class");
        return chars(ascii_all() & ~(c == 'D' ? digits() : c == 'W' ? word() : space()), true);
      case 't': return literal_byte('\t');
      case 'n': return literal_byte('\n');
      case 'r': return literal_byte('\r');
      case 'f': return literal_byte('\f');
      case 'v': return literal_byte('\v');
      default: break;
    }
    if (std::ispunct(uint8_t(c))) return literal_byte(uint8_t(c));
    bad(std::string("the escape \\") + c);
  }

  NodePtr char_class() {
    ++i_;
    const bool negated = peek('^');
    if (negated) ++i_;
    ByteSet set;
    bool first = true;
    while (i_ < p_.size() && (first || p_[i_] != ']')) {
      first = false;
      int lo;
      if (p_[i_] == '\\') {
        NodePtr e = escape(true);
        if (e->ascii.count() != 1) {  // a class escape: no range from it
          set |= e->ascii;
          continue;
        }
        lo = int(e->ascii._Find_first());
      } else {
        if (uint8_t(p_[i_]) >= 0x80) bad("a non-ASCII character in a class");
        lo = uint8_t(p_[i_++]);
      }
      int hi = lo;
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          NodePtr e = escape(true);
          if (e->ascii.count() != 1) bad("a range that ends in a class escape");
          hi = int(e->ascii._Find_first());
        } else {
          if (uint8_t(p_[i_]) >= 0x80) bad("a non-ASCII character in a class");
          hi = uint8_t(p_[i_++]);
        }
        if (hi < lo) bad("a range whose end is below its start");
      }
      set |= range(lo, hi);
    }
    if (!peek(']')) bad("a class without its ']'");
    ++i_;
    return negated ? chars(ascii_all() & ~set, true) : chars(set, false);
  }

  std::string_view p_;
  size_t i_ = 0;
};

Fragment emit_node(Nfa& nfa, const Node& n, const ByteSet& ascii) {
  switch (n.kind) {
    case Node::Kind::chars: {
      std::vector<Fragment> options;
      if ((n.ascii & ascii).any()) options.push_back(nfa.bytes(n.ascii & ascii));
      if (n.multibyte) options.push_back(utf8_multibyte(nfa));
      if (options.size() == 1) return options[0];
      // No character at all (a class of bytes the context excludes): a state that goes nowhere.
      if (options.empty()) return {nfa.add_state(), nfa.add_state()};
      return nfa.alt(options);
    }
    case Node::Kind::byte: return nfa.bytes(n.ascii);
    case Node::Kind::seq: {
      std::vector<Fragment> parts;
      for (const auto& p : n.parts) parts.push_back(emit_node(nfa, *p, ascii));
      return nfa.seq(parts);
    }
    case Node::Kind::alt: {
      std::vector<Fragment> options;
      for (const auto& p : n.parts) options.push_back(emit_node(nfa, *p, ascii));
      return nfa.alt(options);
    }
    case Node::Kind::repeat:
      return nfa.repeat([&] { return emit_node(nfa, *n.parts[0], ascii); }, n.min, n.max);
  }
  return nfa.empty();
}

}  // namespace

Fragment utf8_multibyte(Nfa& nfa) {
  const ByteSet tail = range(0x80, 0xBF);
  auto seq = [&](std::initializer_list<ByteSet> sets) {
    std::vector<Fragment> parts;
    for (const ByteSet& s : sets) parts.push_back(nfa.bytes(s));
    return nfa.seq(parts);
  };
  const std::vector<Fragment> forms{
      seq({range(0xC2, 0xDF), tail}),
      seq({range(0xE0, 0xE0), range(0xA0, 0xBF), tail}),
      seq({range(0xE1, 0xEC) | range(0xEE, 0xEF), tail, tail}),
      seq({range(0xED, 0xED), range(0x80, 0x9F), tail}),
      seq({range(0xF0, 0xF0), range(0x90, 0xBF), tail, tail}),
      seq({range(0xF1, 0xF3), tail, tail, tail}),
      seq({range(0xF4, 0xF4), range(0x80, 0x8F), tail, tail}),
  };
  return nfa.alt(forms);
}

Regex Regex::parse(std::string_view pattern) {
  Regex r;
  r.branches_ = Parser(pattern).parse_all<Branch>();
  return r;
}

Fragment Regex::emit(Nfa& nfa, const ByteSet& ascii) const {
  auto any = [&] {
    return nfa.star(nfa.alt(std::vector<Fragment>{nfa.bytes(ascii), utf8_multibyte(nfa)}));
  };
  std::vector<Fragment> options;
  for (const Branch& b : branches_) {
    std::vector<Fragment> parts;
    if (!b.anchored_start) parts.push_back(any());
    parts.push_back(emit_node(nfa, *b.node, ascii));
    if (!b.anchored_end) parts.push_back(any());
    options.push_back(nfa.seq(parts));
  }
  return options.size() == 1 ? options[0] : nfa.alt(options);
}

}  // namespace dsv41::grammar
