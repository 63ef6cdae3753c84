#pragma once
// Pre-tokenizers of tokenizer.json: ByteLevel, Split, Digits, Metaspace and Sequence. A
// pre-tokenizer cuts text into pieces ("words") that the model encodes one at a time; some
// also rewrite the text (ByteLevel maps bytes to its alphabet, Metaspace spaces to '▁').
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv41 {

// A piece is a byte range of PreTokenized::text. `at_start` marks the piece that begins the
// whole input (Metaspace's prepend_scheme "first" looks at it).
struct Piece {
  size_t begin, end;
  bool at_start;
};

// The text being pre-tokenized and its pieces, in order; bytes outside every piece have been
// removed (e.g. by Split's "removed" behaviour). Kept by the caller between words to reuse
// its buffers.
struct PreTokenized {
  std::string text;
  std::vector<Piece> pieces;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(PreTokenized& s) const = 0;
};

std::unique_ptr<PreTokenizer> pre_tokenizer_from_json(const nlohmann::json& spec, const std::string& where);

}  // namespace dsv41
