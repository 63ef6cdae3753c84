#pragma once
// The compressed vocabulary that Engram hashes over (reference engram.py,
// build_compressed_token_map; docs/engram.md §1): tokens whose decoded text normalizes alike
// (" The", "the", "THE") share one id, numbered by first appearance in token-id order.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace dsv41 {

class Tokenizer;

// The reference's normalizer as a tokenizer.json spec: NFKC, NFD, StripAccents, Lowercase, fold
// runs of [ \t\r\n] to one space, then strip surrounding whitespace except from a text that is
// exactly one space (kept through a private-use sentinel).
nlohmann::json engram_normalizer_spec();

struct EngramVocabulary {
  std::vector<int32_t> token_map;  // raw token id -> compressed id, one entry per tokenizer id
  int64_t size = 0;                // distinct compressed ids (engram_compressed_vocab_size)
};

// Decodes every token id alone (special tokens kept) and keys it by its normalized text, or by its
// raw token string when the text holds U+FFFD (a byte token that is part of a UTF-8 character).
EngramVocabulary engram_compress_vocabulary(const Tokenizer& tokenizer);

}  // namespace dsv41
