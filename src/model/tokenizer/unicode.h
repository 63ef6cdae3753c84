#pragma once
// Unicode helpers of the tokenizer, all over utf8proc: UTF-8 decoding and repair, the four
// normalization forms, and the character classes that Hugging Face tokenizers take from Rust's
// `char` methods (whitespace, lowercase, combining marks, word characters).
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv41::unicode {

// Decodes the code point that starts at text[pos] and returns its length in bytes; the text
// must be valid UTF-8 (every string inside the pipeline is: see to_valid_utf8).
int decode(std::string_view text, size_t pos, char32_t& cp);

// Appends the UTF-8 encoding of cp.
void append_utf8(std::string& out, char32_t cp);

// Length in bytes of the UTF-8 sequence that a lead byte starts (1 for a stray byte).
inline int sequence_length(unsigned char lead) {
  return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
}

bool is_valid_utf8(std::string_view text);

// The text with every maximal invalid subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy and the WHATWG decoder do (so one bad byte gives one U+FFFD).
std::string to_valid_utf8(std::string_view text);

enum class Form { NFC, NFD, NFKC, NFKD };
std::string normalize(std::string_view text, Form form);

// Rust's char::to_lowercase applied to every character (full case mapping, no context).
std::string lowercase(std::string_view text);

// Removes every combining mark (General_Category M: Mn, Mc, Me), as HF's StripAccents does.
std::string strip_accents(std::string_view text);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_whitespace(char32_t cp);

// A word character in the sense of the regex `\w` that HF uses for `single_word` added tokens:
// letters, marks, decimal digits, connector punctuation, letter numbers, ZWNJ/ZWJ.
bool is_word_char(char32_t cp);

// True when every byte is ASCII (then NFC/NFD/NFKC/NFKD change nothing).
bool is_ascii(std::string_view text);

}  // namespace dsv41::unicode
