#include "model/tokenizer/normalizers.h"

#include <vector>

#include "base/error.h"
#include "model/tokenizer/json_fields.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"

namespace dsv41 {

namespace {

using namespace json_fields;

class UnicodeForm final : public Normalizer {
 public:
  explicit UnicodeForm(unicode::Form form) : form_(form) {}
  std::string normalize(std::string_view text) const override { return unicode::normalize(text, form_); }

 private:
  unicode::Form form_;
};

class Lowercase final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return unicode::lowercase(text); }
};

class StripAccents final : public Normalizer {
 public:
  std::string normalize(std::string_view text) const override { return unicode::strip_accents(text); }
};

class Replace final : public Normalizer {
 public:
  Replace(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  std::string normalize(std::string_view text) const override { return pattern_.replace_all(text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

// Prepends a string to any non-empty text (SentencePiece-style "▁" prefixes).
class Prepend final : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string_view text) const override {
    return text.empty() ? std::string() : prefix_ + std::string(text);
  }

 private:
  std::string prefix_;
};

// Removes whitespace (Unicode White_Space) from the left and/or right end.
class Strip final : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string_view text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        char32_t cp;
        int n = unicode::decode(text, begin, cp);
        if (!unicode::is_whitespace(cp)) break;
        begin += size_t(n);
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        char32_t cp;
        unicode::decode(text, start, cp);
        if (!unicode::is_whitespace(cp)) break;
        end = start;
      }
    }
    return std::string(text.substr(begin, end - begin));
  }

 private:
  bool left_, right_;
};

class Sequence final : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string_view text) const override {
    std::string s(text);
    for (const auto& step : steps_) s = step->normalize(s);
    return s;
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> normalizer_from_json(const nlohmann::json& spec, const std::string& where) {
  std::string type = type_of(spec, where);
  if (type == "NFC") return std::make_unique<UnicodeForm>(unicode::Form::NFC);
  if (type == "NFD") return std::make_unique<UnicodeForm>(unicode::Form::NFD);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(unicode::Form::NFKC);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(unicode::Form::NFKD);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Replace")
    return std::make_unique<Replace>(Pattern::from_json(required(spec, "pattern", where), where + ".pattern"),
                                     required_string(spec, "content", where));
  if (type == "Prepend") return std::make_unique<Prepend>(required_string(spec, "prepend", where));
  if (type == "Strip")
    return std::make_unique<Strip>(optional_bool(spec, "strip_left", true, where),
                                   optional_bool(spec, "strip_right", true, where));
  if (type == "Sequence") {
    const json& list = required(spec, "normalizers", where);
    if (!list.is_array()) fail(where + ".normalizers", "an array", list.dump());
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(normalizer_from_json(list[i], where + ".normalizers[" + std::to_string(i) + "]"));
    return std::make_unique<Sequence>(std::move(steps));
  }
  unsupported_type(where, "normalizer", type,
                   "NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Replace, Prepend, Strip, Sequence");
}

}  // namespace dsv41
