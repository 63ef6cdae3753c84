#pragma once
// Cleaning of corpus text (docs/training-data.md, "Cleaning"): the encoding checked as UTF-8,
// Project Gutenberg boilerplate removed, Unicode in NFC, whitespace normalised, and hard-wrapped
// prose joined into one line per paragraph. Every function is pure: text in, text out.
#include <string>
#include <string_view>

namespace dsv41::train {

// Throws dsv41::Error "WHERE: expected UTF-8 text, found the invalid byte 0xNN at byte K" at the
// first byte that does not start or continue a well-formed UTF-8 sequence.
void check_utf8(std::string_view text, const std::string& where);

// The text between a Project Gutenberg header and footer: everything up to and including the
// line "*** START OF THE (or THIS) PROJECT GUTENBERG EBOOK ..." (or the older "*END*THE SMALL
// PRINT!") is removed, and so is everything from the line "*** END OF THE PROJECT GUTENBERG ..."
// (or "End of the Project Gutenberg EBook ...") on. Text without these lines is returned as is.
std::string strip_gutenberg(std::string_view text);

// Line breaks as "\n" (CR LF, CR, VT, FF, NEL, U+2028 and U+2029 are line breaks); every other
// White_Space character a space; control characters and U+FEFF removed; tabs in the indentation
// expanded to 8 columns; the common indentation of all lines removed and what remains capped at
// kMaxIndent spaces; runs of spaces inside a line one space; no trailing spaces; at most one
// blank line in a row; no blank lines at the start or end, and no final newline.
std::string normalize_whitespace(std::string_view text);
inline constexpr int kMaxIndent = 8;

// Joins hard-wrapped prose (text already through normalize_whitespace): within a paragraph
// (lines between blank lines), a line that is not indented continues the one before it when that
// one is not indented either, after a space — or with none after a word broken at its hyphen
// ("cannon-" + "shot" is "cannon-shot": the hyphen is kept, as it is in hard-wrapped texts
// that do not hyphenate). Indented lines (verse, code, quotations) keep their own lines.
std::string unwrap_paragraphs(std::string_view text);

// The whole cleaning of one document: check_utf8 (naming `where`), strip_gutenberg, NFC,
// normalize_whitespace and, for hard-wrapped sources, unwrap_paragraphs.
std::string clean_text(std::string_view raw, bool hard_wrapped, const std::string& where);

}  // namespace dsv41::train
