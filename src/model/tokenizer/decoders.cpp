#include "model/tokenizer/decoders.h"

#include "base/error.h"
#include "model/tokenizer/byte_level.h"
#include "model/tokenizer/json_fields.h"
#include "model/tokenizer/regex.h"
#include "model/tokenizer/unicode.h"

namespace dsv41 {

namespace {

using namespace json_fields;

constexpr const char* kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Every token back to its bytes, all joined, then read as UTF-8 with invalid sequences shown
// as U+FFFD. A token with a character outside the byte-level alphabet (an added token such
// as "<｜User｜>") stands for its own UTF-8 bytes.
class ByteLevel final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const std::string& token : tokens) {
      size_t start = bytes.size();
      for (size_t i = 0; i < token.size();) {
        char32_t cp;
        i += size_t(unicode::decode(token, i, cp));
        int b = byte_level::byte_of(cp);
        if (b < 0) {
          bytes.resize(start);
          bytes += token;
          break;
        }
        bytes += char(b);
      }
    }
    tokens.assign(1, unicode::to_valid_utf8(bytes));
  }
};

// The replacement character back to spaces; in the first token it is dropped instead (it was
// prepended by the pre-tokenizer), unless the prepend scheme is "never".
class Metaspace final : public Decoder {
 public:
  Metaspace(std::string replacement, bool prepended) : replacement_(std::move(replacement)), prepended_(prepended) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      for (size_t pos = 0; pos < t.size();) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          if (i > 0 || !prepended_) out += ' ';
          pos += replacement_.size();
        } else {
          out += t[pos++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepended_;
};

class Replace final : public Decoder {
 public:
  Replace(Pattern pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (std::string& t : tokens) t = pattern_.replace_all(t, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// Removes up to `start` copies of a character from the front of each token and up to `stop`
// from its back.
class Strip final : public Decoder {
 public:
  Strip(std::string content, int start, int stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    size_t n = content_.size();
    for (std::string& t : tokens) {
      size_t begin = 0, end = t.size();
      for (int i = 0; i < start_ && end - begin >= n && t.compare(begin, n, content_) == 0; ++i) begin += n;
      for (int i = 0; i < stop_ && end - begin >= n && t.compare(end - n, n, content_) == 0; ++i) end -= n;
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  int start_, stop_;
};

class Fuse final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Runs of <0xXX> tokens become the text their bytes spell; a run that is not valid UTF-8
// becomes one U+FFFD per byte (as HF does).
class ByteFallback final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_length = 0;
    auto flush = [&] {
      if (run_length == 0) return;
      if (unicode::is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_length; ++i) out.push_back(kReplacementChar);
      }
      run.clear();
      run_length = 0;
    };
    for (std::string& t : tokens) {
      int byte = byte_token(t);
      if (byte >= 0) {
        run += char(byte);
        ++run_length;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  // The byte of a token "<0xAB>" (hex digits in either case), or -1.
  static int byte_token(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    int value = 0;
    for (int i = 3; i < 5; ++i) {
      char c = t[size_t(i)];
      int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (digit < 0) return -1;
      value = value * 16 + digit;
    }
    return value;
  }
};

class Sequence final : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

bool metaspace_prepends(const json& spec, const std::string& where) {
  std::string scheme = optional_string(spec, "prepend_scheme", "", where);
  if (scheme.empty()) return optional_bool(spec, "add_prefix_space", true, where);
  if (scheme != "always" && scheme != "first" && scheme != "never")
    fail(where + ".prepend_scheme", "one of always, first, never", "'" + scheme + "'");
  return scheme != "never";
}

}  // namespace

std::unique_ptr<Decoder> decoder_from_json(const nlohmann::json& spec, const std::string& where) {
  std::string type = type_of(spec, where);
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Metaspace")
    return std::make_unique<Metaspace>(required_char(spec, "replacement", where), metaspace_prepends(spec, where));
  if (type == "Replace")
    return std::make_unique<Replace>(Pattern::from_json(required(spec, "pattern", where), where + ".pattern"),
                                     required_string(spec, "content", where));
  if (type == "Strip")
    return std::make_unique<Strip>(required_char(spec, "content", where), optional_int(spec, "start", 0, where),
                                   optional_int(spec, "stop", 0, where));
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Sequence") {
    const json& list = required(spec, "decoders", where);
    if (!list.is_array()) fail(where + ".decoders", "an array", list.dump());
    std::vector<std::unique_ptr<Decoder>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(decoder_from_json(list[i], where + ".decoders[" + std::to_string(i) + "]"));
    return std::make_unique<Sequence>(std::move(steps));
  }
  unsupported_type(where, "decoder", type, "ByteLevel, Metaspace, Replace, Strip, Fuse, ByteFallback, Sequence");
}

}  // namespace dsv41
