#include "train/data/text_clean.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "base/error.h"
#include "model/tokenizer/unicode.h"

namespace dsv41::train {

namespace {

// A line as normalize_whitespace keeps it: its indentation in columns and its text, which has
// no leading or trailing spaces and single spaces inside.
struct Line {
  int indent = 0;
  std::string body;
};

bool is_line_break(char32_t cp) { return cp == '\n' || cp == 0x0B || cp == 0x0C || cp == 0x85 || cp == 0x2028 || cp == 0x2029; }
bool is_removed_control(char32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0xFEFF; }

std::vector<Line> read_lines(std::string_view text) {
  std::vector<Line> lines;
  Line line;
  bool at_start = true, pending_space = false;
  auto end_line = [&] {
    lines.push_back(std::move(line));
    line = Line{};
    at_start = true;
    pending_space = false;
  };
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    i += size_t(unicode::decode(text, i, cp));
    if (cp == '\r') {
      if (i < text.size() && text[i] == '\n') ++i;
      end_line();
    } else if (is_line_break(cp)) {
      end_line();
    } else if (cp == '\t') {
      if (at_start) line.indent = (line.indent / 8 + 1) * 8;
      else pending_space = true;
    } else if (unicode::is_whitespace(cp)) {
      if (at_start) line.indent += 1;
      else pending_space = true;
    } else if (!is_removed_control(cp)) {
      if (pending_space) line.body += ' ';
      pending_space = at_start = false;
      unicode::append_utf8(line.body, cp);
    }
  }
  end_line();
  return lines;
}

// Case-insensitive ASCII: does `line`, after leading spaces, start with `prefix` (lower case)?
bool starts_with_nocase(std::string_view line, std::string_view prefix) {
  size_t i = line.find_first_not_of(' ');
  if (i == std::string_view::npos || line.size() - i < prefix.size()) return false;
  for (size_t k = 0; k < prefix.size(); ++k) {
    char c = line[i + k];
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    if (c != prefix[k]) return false;
  }
  return true;
}

bool is_gutenberg_start(std::string_view line) {
  return starts_with_nocase(line, "*** start of the project gutenberg") ||
         starts_with_nocase(line, "*** start of this project gutenberg") ||
         starts_with_nocase(line, "***start of the project gutenberg") ||
         starts_with_nocase(line, "*end*the small print!");
}

bool is_gutenberg_end(std::string_view line) {
  return starts_with_nocase(line, "*** end of the project gutenberg") ||
         starts_with_nocase(line, "*** end of this project gutenberg") ||
         starts_with_nocase(line, "***end of the project gutenberg") ||
         starts_with_nocase(line, "end of the project gutenberg") ||
         starts_with_nocase(line, "end of project gutenberg");
}

bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

}  // namespace

void check_utf8(std::string_view text, const std::string& where) {
  if (unicode::is_valid_utf8(text)) return;
  // The repaired text equals the original up to the first invalid sequence, where it has
  // U+FFFD; the first byte that differs may be inside that U+FFFD (when the bad bytes begin
  // like it), so the sequence starts at the beginning of the repaired character there.
  const std::string repaired = unicode::to_valid_utf8(text);
  size_t at = 0;
  while (at < text.size() && at < repaired.size() && text[at] == repaired[at]) ++at;
  while (at > 0 && (static_cast<unsigned char>(repaired[at]) & 0xC0) == 0x80) --at;
  char found[64];
  std::snprintf(found, sizeof found, "the invalid byte 0x%02X at byte %zu", static_cast<unsigned char>(text[at]), at);
  fail(where, "UTF-8 text", found);
}

std::string strip_gutenberg(std::string_view text) {
  size_t begin = 0, end = text.size();
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    const size_t next = eol == std::string_view::npos ? text.size() : eol + 1;
    const std::string_view line = text.substr(pos, next - pos);
    if (is_gutenberg_start(line)) {
      begin = next;
    } else if (is_gutenberg_end(line) && pos >= begin) {
      end = pos;
      break;
    }
    pos = next;
  }
  return std::string(text.substr(begin, end - begin));
}

std::string normalize_whitespace(std::string_view text) {
  std::vector<Line> lines = read_lines(text);
  int common = -1;
  for (const Line& l : lines)
    if (!l.body.empty()) common = common < 0 ? l.indent : std::min(common, l.indent);
  std::string out;
  out.reserve(text.size());
  bool blank_pending = false;
  for (const Line& l : lines) {
    if (l.body.empty()) {
      blank_pending = !out.empty();
      continue;
    }
    if (!out.empty()) out += blank_pending ? "\n\n" : "\n";
    blank_pending = false;
    out.append(size_t(std::min(l.indent - common, kMaxIndent)), ' ');
    out += l.body;
  }
  return out;
}

std::string unwrap_paragraphs(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool blank = false;           // a blank line since the last line written
  bool previous_prose = false;  // the line before, in this paragraph, is not indented
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.empty()) {
      blank = true;
      continue;
    }
    const bool prose = line.front() != ' ';
    if (!out.empty()) {
      const size_t n = out.size();
      const bool broken_word = n >= 2 && out[n - 1] == '-' && is_ascii_letter(out[n - 2]) && is_ascii_letter(line.front());
      if (blank) out += "\n\n";
      else if (!(prose && previous_prose)) out += '\n';
      else if (!broken_word) out += ' ';
    }
    out += line;
    blank = false;
    previous_prose = prose;
  }
  return out;
}

std::string clean_text(std::string_view raw, bool hard_wrapped, const std::string& where) {
  check_utf8(raw, where);
  const std::string text = normalize_whitespace(unicode::normalize(strip_gutenberg(raw), unicode::Form::NFC));
  return hard_wrapped ? unwrap_paragraphs(text) : text;
}

}  // namespace dsv41::train
