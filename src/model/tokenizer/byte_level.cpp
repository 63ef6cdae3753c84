#include "model/tokenizer/byte_level.h"

#include <array>
#include <string>

#include "model/tokenizer/unicode.h"

namespace dsv41::byte_level {

namespace {

struct Alphabet {
  std::array<std::string, 256> chars;  // UTF-8, one or two bytes each
  std::array<int16_t, 512> bytes;  // every code point of the alphabet is below 512

  Alphabet() {
    bytes.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? char32_t(b) : next++;
      unicode::append_utf8(chars[size_t(b)], cp);
      bytes[cp] = int16_t(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

void append_mapped(std::string_view bytes, std::string& out) {
  const Alphabet& a = alphabet();
  for (unsigned char b : bytes) out.append(a.chars[b]);
}

int byte_of(char32_t cp) { return cp < 512 ? alphabet().bytes[cp] : -1; }

}  // namespace dsv41::byte_level
