#pragma once
// Normalizers of tokenizer.json: NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Replace (string
// or regex pattern), Prepend, Strip, and Sequence of these. Each behaves as the Hugging Face
// tokenizers component of the same name (docs/tokenizer.md).
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace dsv41 {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // `text` must be valid UTF-8; so is the result.
  virtual std::string normalize(std::string_view text) const = 0;
};

// Builds a normalizer from its tokenizer.json spec, e.g.
//   {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}.
// `where` names the component in errors; an unknown type is refused by name.
std::unique_ptr<Normalizer> normalizer_from_json(const nlohmann::json& spec, const std::string& where = "normalizer");

}  // namespace dsv41
