#pragma once
// The byte-level alphabet of GPT-2 style tokenizers: every byte is shown as one printable
// Unicode character, so that a vocabulary of strings can hold arbitrary bytes. Printable
// Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 bytes take
// the code points 256, 257, ... in byte order (space becomes 'Ġ' U+0120, newline 'Ċ' U+010A).
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv41::byte_level {

// Appends the alphabet's character for every byte of `bytes` to `out`.
void append_mapped(std::string_view bytes, std::string& out);

// The byte that code point cp stands for, or -1 when cp is not in the alphabet.
int byte_of(char32_t cp);

}  // namespace dsv41::byte_level
