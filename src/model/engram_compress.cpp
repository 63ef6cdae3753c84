#include "model/engram_compress.h"

#include <memory>
#include <string>
#include <unordered_map>

#include "model/tokenizer/normalizers.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

namespace {

// U+E000, a private-use character no token text normalizes to: it stands in for a lone space
// while Strip runs, so that a token that is exactly one space does not become empty.
constexpr const char* kSentinel = "\xEE\x80\x80";
constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

nlohmann::json engram_normalizer_spec() {
  using json = nlohmann::json;
  auto replace = [](const char* kind, const char* pattern, const char* content) {
    return json{{"type", "Replace"}, {"pattern", {{kind, pattern}}}, {"content", content}};
  };
  return json{{"type", "Sequence"},
              {"normalizers", json::array({
                                  json{{"type", "NFKC"}},
                                  json{{"type", "NFD"}},
                                  json{{"type", "StripAccents"}},
                                  json{{"type", "Lowercase"}},
                                  replace("Regex", "[ \t\r\n]+", " "),
                                  replace("Regex", "^ $", kSentinel),
                                  json{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                                  replace("String", kSentinel, " "),
                              })}};
}

EngramVocabulary engram_compress_vocabulary(const Tokenizer& tokenizer) {
  const std::unique_ptr<Normalizer> normalizer = normalizer_from_json(engram_normalizer_spec(), "Engram normalizer");
  EngramVocabulary vocab;
  std::unordered_map<std::string, int32_t> key_to_id;
  const size_t n = tokenizer.vocab_size();
  vocab.token_map.reserve(n);
  for (size_t id = 0; id < n; ++id) {
    const int one[1] = {int(id)};
    const std::string text = tokenizer.decode(one, /*skip_special_tokens=*/false);
    std::string key;
    if (text.find(kReplacementChar) != std::string::npos) {
      key = tokenizer.id_to_token(int(id));
    } else {
      key = normalizer->normalize(text);
      if (key.empty()) key = text;
    }
    // A new key takes the next id; a known one keeps the id of its first appearance.
    vocab.token_map.push_back(key_to_id.try_emplace(std::move(key), int32_t(key_to_id.size())).first->second);
  }
  vocab.size = int64_t(key_to_id.size());
  return vocab;
}

}  // namespace dsv41
