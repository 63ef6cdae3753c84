#include "model/tokenizer/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "base/error.h"

namespace dsv41::unicode {

int decode(std::string_view text, size_t pos, char32_t& cp) {
  auto s = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  unsigned char b = s[0];
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  int n = sequence_length(b);
  char32_t c = b & (0x7F >> n);
  for (int i = 1; i < n; ++i) c = (c << 6) | (s[i] & 0x3F);
  cp = c;
  return n;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

// How many bytes of a well-formed sequence start at s[0..n): 0 when s[0] cannot start one,
// otherwise the count of leading bytes that fit (the whole length when the sequence is
// complete). The ranges are those of the Unicode standard's table 3-7, which excludes
// overlong forms, surrogates and code points above U+10FFFF.
int valid_prefix(const unsigned char* s, size_t n, int& full) {
  unsigned char b = s[0];
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    full = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    full = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    full = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    full = 1;
    return b < 0x80 ? 1 : 0;
  }
  int k = 1;
  while (k < full && size_t(k) < n) {
    unsigned char c = s[k];
    bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) break;
    ++k;
  }
  return k;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  auto s = reinterpret_cast<const unsigned char*>(text.data());
  size_t i = 0, n = text.size();
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    int full;
    int k = valid_prefix(s + i, n - i, full);
    if (k != full) return false;
    i += size_t(k);
  }
  return true;
}

std::string to_valid_utf8(std::string_view text) {
  auto s = reinterpret_cast<const unsigned char*>(text.data());
  std::string out;
  out.reserve(text.size());
  size_t i = 0, n = text.size();
  while (i < n) {
    int full;
    int k = valid_prefix(s + i, n - i, full);
    if (k == full) {
      out.append(text.data() + i, size_t(k));
    } else {
      out += "\xEF\xBF\xBD";  // U+FFFD for the maximal invalid subpart
      if (k == 0) k = 1;
    }
    i += size_t(k);
  }
  return out;
}

std::string normalize(std::string_view text, Form form) {
  if (is_ascii(text)) return std::string(text);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Form::NFC: options |= UTF8PROC_COMPOSE; break;
    case Form::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case Form::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Form::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* result = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                    utf8proc_ssize_t(text.size()), &result, utf8proc_option_t(options));
  if (n < 0) fail("unicode normalization", "valid UTF-8", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, &std::free);
  return std::string(reinterpret_cast<const char*>(result), size_t(n));
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    i += size_t(decode(text, i, cp));
    // utf8proc gives the simple mapping; the only unconditional full mapping that differs
    // (SpecialCasing.txt) is U+0130 LATIN CAPITAL LETTER I WITH DOT ABOVE -> "i" + U+0307.
    if (cp == 0x130) {
      out += "i\xCC\x87";
    } else {
      append_utf8(out, char32_t(utf8proc_tolower(utf8proc_int32_t(cp))));
    }
  }
  return out;
}

std::string strip_accents(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    int n = decode(text, i, cp);
    utf8proc_category_t c = utf8proc_category(utf8proc_int32_t(cp));
    if (c != UTF8PROC_CATEGORY_MN && c != UTF8PROC_CATEGORY_MC && c != UTF8PROC_CATEGORY_ME)
      out.append(text.data() + i, size_t(n));
    i += size_t(n);
  }
  return out;
}

bool is_whitespace(char32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85) return true;
  if (cp < 0x80) return false;
  utf8proc_category_t c = utf8proc_category(utf8proc_int32_t(cp));
  return c == UTF8PROC_CATEGORY_ZS || c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP;
}

bool is_word_char(char32_t cp) {
  if (cp == 0x200C || cp == 0x200D) return true;
  switch (utf8proc_category(utf8proc_int32_t(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool is_ascii(std::string_view text) {
  for (unsigned char c : text)
    if (c >= 0x80) return false;
  return true;
}

}  // namespace dsv41::unicode
