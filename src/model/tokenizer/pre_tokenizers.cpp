#include "model/tokenizer/pre_tokenizers.h"

#include <algorithm>

#include "base/error.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/json_fields.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"

namespace dsv41 {

namespace {

using namespace json_fields;

// What Split does with the pieces a pattern matched (HF's SplitDelimiterBehavior).
enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior behavior_from_json(const json& spec, const std::string& where) {
  std::string b = required_string(spec, "behavior", where);
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail(where + ".behavior", "one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous", "'" + b + "'");
}

struct Span {
  size_t begin, end;
  bool is_match;
};

// Cuts `piece` at the matches (offsets relative to the piece) and appends the non-empty
// resulting pieces to `out`, following HF's rules for each behaviour. `spans` and `merged` are
// scratch space, passed in to be reused from piece to piece.
void split_piece(const Piece& piece, const std::vector<Match>& matches, Behavior behavior, bool invert,
                 std::vector<Span>& spans, std::vector<Span>& merged, std::vector<Piece>& out) {
  // The piece as alternating spans: the gaps between matches and the matches themselves.
  spans.clear();
  merged.clear();
  size_t prev = 0, length = piece.end - piece.begin;
  for (const Match& m : matches) {
    if (prev < m.begin) spans.push_back({prev, m.begin, false});
    spans.push_back({m.begin, m.end, true});
    prev = m.end;
  }
  if (prev < length) spans.push_back({prev, length, false});
  if (invert)
    for (Span& s : spans) s.is_match = !s.is_match;

  switch (behavior) {
    case Behavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case Behavior::Isolated:
      merged.swap(spans);
      break;
    case Behavior::MergedWithPrevious: {
      // A match joins the piece before it, unless that piece is itself a match.
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty())
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
    }
    case Behavior::MergedWithNext: {
      // Mirror image: a match joins the piece after it, unless that piece is a match.
      bool next_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !next_match && !merged.empty())
          merged.back().begin = it->begin;
        else
          merged.push_back(*it);
        next_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
    case Behavior::Contiguous: {
      // Neighbouring spans of the same kind become one piece.
      for (size_t i = 0; i < spans.size(); ++i) {
        if (i > 0 && spans[i].is_match == spans[i - 1].is_match)
          merged.back().end = spans[i].end;
        else
          merged.push_back(spans[i]);
      }
      break;
    }
  }
  for (const Span& s : merged)
    if (s.end > s.begin) out.push_back({piece.begin + s.begin, piece.begin + s.end, piece.at_start && s.begin == 0});
}

// Buffers reused from call to call on each thread: without them, allocation would cost more
// than the splitting of a short line. Swapped with the PreTokenized ones, so both keep their
// capacity.
struct Scratch {
  std::string text;
  std::vector<Piece> pieces;
  std::vector<Match> matches;
  std::vector<Span> spans, merged;
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Applies `find` (which lists the matches of one piece) and the behaviour to every piece.
template <class Find>
void split_all(PreTokenized& s, Behavior behavior, bool invert, Find&& find) {
  Scratch& x = scratch();
  x.pieces.clear();
  for (const Piece& p : s.pieces) {
    x.matches.clear();
    find(std::string_view(s.text).substr(p.begin, p.end - p.begin), x.matches);
    split_piece(p, x.matches, behavior, invert, x.spans, x.merged, x.pieces);
  }
  s.pieces.swap(x.pieces);
}

// Rebuilds the text from its pieces, each passed through `rewrite(piece_text, piece, out)`,
// which appends the new text of the piece to `out`.
template <class Rewrite>
void rewrite_all(PreTokenized& s, Rewrite&& rewrite) {
  std::string& text = scratch().text;
  text.clear();
  for (Piece& p : s.pieces) {
    size_t begin = text.size();
    rewrite(std::string_view(s.text).substr(p.begin, p.end - p.begin), p, text);
    p.begin = begin;
    p.end = text.size();
  }
  s.text.swap(text);
}

class Split final : public PreTokenizer {
 public:
  Split(Pattern pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(PreTokenized& s) const override {
    split_all(s, behavior_, invert_, [&](std::string_view t, std::vector<Match>& m) { pattern_.find_all(t, m); });
  }

 private:
  Pattern pattern_;
  Behavior behavior_;
  bool invert_;
};

// Digits: ASCII digits apart from the rest, each on its own or in runs.
class Digits final : public PreTokenizer {
 public:
  explicit Digits(bool individual) : individual_(individual) {}
  void pre_tokenize(PreTokenized& s) const override {
    // Every digit is a match of its own; Contiguous then joins runs of them.
    auto find = [](std::string_view t, std::vector<Match>& m) {
      for (size_t i = 0; i < t.size(); ++i)
        if (t[i] >= '0' && t[i] <= '9') m.push_back({i, i + 1});
    };
    split_all(s, individual_ ? Behavior::Isolated : Behavior::Contiguous, false, find);
  }

 private:
  bool individual_;
};

// GPT-2's pre-tokenization regex, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel final : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& where)
      : add_prefix_space_(add_prefix_space), regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, where) : nullptr) {}

  void pre_tokenize(PreTokenized& s) const override {
    if (add_prefix_space_)
      rewrite_all(s, [](std::string_view t, const Piece&, std::string& out) {
        if (t.empty() || t[0] != ' ') out += ' ';
        out.append(t);
      });
    if (regex_)
      split_all(s, Behavior::Isolated, false, [&](std::string_view t, std::vector<Match>& m) { regex_->find_all(t, m); });
    rewrite_all(s, [](std::string_view t, const Piece&, std::string& out) { byte_level::append_mapped(t, out); });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

// Metaspace: spaces become the replacement character ('▁'), which is prepended to pieces as the
// prepend scheme says, and (with split) each piece is cut before every replacement character.
class Metaspace final : public PreTokenizer {
 public:
  enum class Prepend { Always, First, Never };
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}

  void pre_tokenize(PreTokenized& s) const override {
    rewrite_all(s, [&](std::string_view t, const Piece& p, std::string& out) {
      size_t start = out.size();
      for (char c : t) {
        if (c == ' ')
          out += replacement_;
        else
          out += c;
      }
      bool starts_with_replacement = out.compare(start, replacement_.size(), replacement_) == 0;
      bool prepend = prepend_ == Prepend::Always || (prepend_ == Prepend::First && p.at_start);
      if (prepend && !starts_with_replacement) out.insert(start, replacement_);
    });
    if (split_)
      split_all(s, Behavior::MergedWithNext, false, [&](std::string_view t, std::vector<Match>& m) {
        for (size_t pos = t.find(replacement_); pos != std::string_view::npos; pos = t.find(replacement_, pos + 1))
          m.push_back({pos, pos + replacement_.size()});
      });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

class Sequence final : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(PreTokenized& s) const override {
    for (const auto& step : steps_) step->pre_tokenize(s);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

Metaspace::Prepend prepend_scheme(const json& spec, const std::string& where) {
  auto it = spec.find("prepend_scheme");
  if (it == spec.end() || it->is_null()) {
    // Files written before prepend_scheme existed say add_prefix_space instead.
    return optional_bool(spec, "add_prefix_space", true, where) ? Metaspace::Prepend::Always
                                                                 : Metaspace::Prepend::Never;
  }
  std::string s = required_string(spec, "prepend_scheme", where);
  if (s == "always") return Metaspace::Prepend::Always;
  if (s == "first") return Metaspace::Prepend::First;
  if (s == "never") return Metaspace::Prepend::Never;
  fail(where + ".prepend_scheme", "one of always, first, never", "'" + s + "'");
}

}  // namespace

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const nlohmann::json& spec, const std::string& where) {
  std::string type = type_of(spec, where);
  if (type == "ByteLevel")
    return std::make_unique<ByteLevel>(optional_bool(spec, "add_prefix_space", true, where),
                                       optional_bool(spec, "use_regex", true, where), where);
  if (type == "Split")
    return std::make_unique<Split>(Pattern::from_json(required(spec, "pattern", where), where + ".pattern"),
                                   behavior_from_json(spec, where), optional_bool(spec, "invert", false, where));
  if (type == "Digits") return std::make_unique<Digits>(optional_bool(spec, "individual_digits", false, where));
  if (type == "Metaspace")
    return std::make_unique<Metaspace>(required_char(spec, "replacement", where), prepend_scheme(spec, where),
                                       optional_bool(spec, "split", true, where));
  if (type == "Sequence") {
    const json& list = required(spec, "pretokenizers", where);
    if (!list.is_array()) fail(where + ".pretokenizers", "an array", list.dump());
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(pre_tokenizer_from_json(list[i], where + ".pretokenizers[" + std::to_string(i) + "]"));
    return std::make_unique<Sequence>(std::move(steps));
  }
  unsupported_type(where, "pre_tokenizer", type, "ByteLevel, Split, Digits, Metaspace, Sequence");
}

}  // namespace dsv41
