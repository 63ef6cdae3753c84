#include "model/tokenizer/tokenizer.h"

#include <fstream>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "model/json_document.h"
#include "model/tokenizer/added_tokens.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/decoders.h"
#include "model/tokenizer/json_fields.h"
#include "model/tokenizer/normalizers.h"
#include "model/tokenizer/post_processor.h"
#include "model/tokenizer/pre_tokenizers.h"
#include "model/tokenizer/unicode.h"

namespace dsv41 {

using namespace json_fields;

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;         // each may be null: that step does nothing
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::unordered_map<int, AddedToken> added;      // by id
  StringIdMap added_ids;                          // content -> id
  AddedTokenMatcher raw_matcher;                  // tokens with normalized = false
  AddedTokenMatcher normalized_matcher;           // tokens with normalized = true
  size_t vocab_size = 0;

  void encode_words(std::string_view text, bool at_start, PreTokenized& scratch, std::vector<int>& ids) const;
};

namespace {

std::vector<AddedToken> added_tokens_from_json(const json& root, const std::string& where) {
  std::vector<AddedToken> tokens;
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return tokens;
  if (!it->is_array()) fail(where + ": added_tokens", "an array", it->type_name());
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    std::string at = where + ": added_tokens[" + std::to_string(i) + "]";
    AddedToken a;
    const json& id = required(t, "id", at);
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30))
      fail(at + ".id", "a non-negative id", id.dump());
    a.id = id.get<int>();
    a.content = required_string(t, "content", at);
    if (!unicode::is_valid_utf8(a.content)) fail(at + ".content", "valid UTF-8", "invalid bytes");
    a.single_word = optional_bool(t, "single_word", false, at);
    a.lstrip = optional_bool(t, "lstrip", false, at);
    a.rstrip = optional_bool(t, "rstrip", false, at);
    a.special = optional_bool(t, "special", false, at);
    a.normalized = optional_bool(t, "normalized", !a.special, at);
    tokens.push_back(std::move(a));
  }
  return tokens;
}

// Components that would change what encode returns in ways this tokenizer does not implement
// are refused rather than ignored.
void refuse_if_set(const json& root, const char* key, const std::string& where) {
  auto it = root.find(key);
  if (it != root.end() && !it->is_null())
    fail(where + ": " + key, "null (" + std::string(key) + " is not supported)", it->dump());
}

}  // namespace

Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable tokenizer.json", "no such file");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_json(ss.str(), path);
}

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& where) {
  const json root = parse_json(text, where);
  if (!root.is_object()) fail(where, "a tokenizer.json object", root.type_name());
  refuse_if_set(root, "truncation", where);
  refuse_if_set(root, "padding", where);

  auto impl = std::make_shared<Impl>();
  auto component = [&](const char* key) -> const json* {
    auto it = root.find(key);
    return it == root.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* j = component("normalizer")) impl->normalizer = normalizer_from_json(*j, where + ": normalizer");
  if (const json* j = component("pre_tokenizer"))
    impl->pre_tokenizer = pre_tokenizer_from_json(*j, where + ": pre_tokenizer");
  impl->model = BpeModel::from_json(required(root, "model", where), where + ": model");
  if (const json* j = component("post_processor"))
    impl->post_processor = post_processor_from_json(*j, where + ": post_processor");
  if (const json* j = component("decoder")) impl->decoder = decoder_from_json(*j, where + ": decoder");

  std::vector<AddedToken> added = added_tokens_from_json(root, where);
  std::vector<AddedToken> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  int max_id = impl->model->max_id();
  const int64_t id_limit = token_id_limit(int64_t(impl->model->size()) + int64_t(added.size()));
  for (size_t i = 0; i < added.size(); ++i) {
    const AddedToken& a = added[i];
    const std::string at = where + ": added_tokens[" + std::to_string(i) + "].id";
    if (a.id >= id_limit)
      fail(at, "a token id in [0, " + std::to_string(id_limit) + ") (" + kTokenIdLimitRule + ")", std::to_string(a.id));
    if (impl->added.count(a.id)) fail(at, "an id no other added token has", std::to_string(a.id) + ", also '" + impl->added[a.id].content + "'");
    impl->added[a.id] = a;
    impl->added_ids[a.content] = a.id;
    max_id = std::max(max_id, a.id);
    // A normalized token is looked for in normalized text, so in its normalized form.
    if (a.normalized) {
      normalized.push_back(a);
      normalized_patterns.push_back(impl->normalizer ? impl->normalizer->normalize(a.content) : a.content);
    } else {
      raw.push_back(a);
      raw_patterns.push_back(a.content);
    }
  }
  impl->raw_matcher = AddedTokenMatcher(raw, raw_patterns);
  impl->normalized_matcher = AddedTokenMatcher(normalized, normalized_patterns);
  impl->vocab_size = size_t(max_id + 1);
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::encode_words(std::string_view text, bool at_start, PreTokenized& scratch,
                                   std::vector<int>& ids) const {
  scratch.text.assign(text);
  scratch.pieces.assign(1, {0, text.size(), at_start});
  if (pre_tokenizer) pre_tokenizer->pre_tokenize(scratch);
  std::string_view all(scratch.text);
  for (const Piece& p : scratch.pieces) model->tokenize(all.substr(p.begin, p.end - p.begin), ids);
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!unicode::is_valid_utf8(text)) {
    repaired = unicode::to_valid_utf8(text);
    text = repaired;
  }
  std::vector<int> ids;
  ids.reserve(text.size() / 3 + 4);
  // Kept per thread so that its buffers outlive one call (encode is const and may run on
  // several threads; it never re-enters itself).
  thread_local PreTokenized scratch;
  auto push_token = [&](int id) { ids.push_back(id); };
  // 1. Added tokens matched on the raw text; 2. the text between them normalized, and added
  // tokens with normalized = true matched in it; 3. what is left pre-tokenized and encoded.
  m.raw_matcher.split(
      text,
      [&](size_t begin, size_t end) {
        std::string_view section = text.substr(begin, end - begin);
        std::string normalized;
        if (m.normalizer) {
          normalized = m.normalizer->normalize(section);
          section = normalized;
        }
        m.normalized_matcher.split(
            section,
            [&](size_t b, size_t e) { m.encode_words(section.substr(b, e - b), begin == 0 && b == 0, scratch, ids); },
            push_token);
      },
      push_token);
  if (add_special_tokens && m.post_processor) m.post_processor->process(ids);
  return ids;
}

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int id : ids) {
    auto added = m.added.find(id);
    if (added != m.added.end()) {
      if (!(skip_special_tokens && added->second.special)) tokens.push_back(added->second.content);
    } else if (const std::string* token = m.model->id_to_token(id)) {
      tokens.push_back(*token);
    }
  }
  if (!m.decoder) {
    // Without a decoder HF joins the tokens with spaces.
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  m.decoder->decode_chain(tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Tokenizer::id_to_token(int id) const {
  auto added = impl_->added.find(id);
  if (added != impl_->added.end()) return added->second.content;
  if (const std::string* token = impl_->model->id_to_token(id)) return *token;
  fail("Tokenizer::id_to_token", "an id of the vocabulary (0.." + std::to_string(vocab_size() - 1) + ")",
       std::to_string(id));
}

std::optional<int> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_ids.find(token);
  if (it != impl_->added_ids.end()) return it->second;
  return impl_->model->token_to_id(token);
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

bool Tokenizer::is_special(int id) const {
  auto it = impl_->added.find(id);
  return it != impl_->added.end() && it->second.special;
}

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_(skip_special_tokens) {}

std::string StreamDecoder::push(int id) {
  ids_.push_back(id);
  return emit(false);
}

std::string StreamDecoder::flush() { return emit(true); }

std::string StreamDecoder::emit(bool force) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string text = tokenizer_.decode(ids_, skip_special_);
  if (text.size() <= prefix_.size()) return {};
  if (!force && std::string_view(text).ends_with(kReplacement)) return {};  // maybe half a character
  if (text.compare(0, prefix_.size(), prefix_) != 0)
    fail("StreamDecoder", "decoded text that extends the text already returned", "'" + text + "'");
  std::string out = text.substr(prefix_.size());
  // The ids just emitted become the context of the next ones.
  ids_.erase(ids_.begin(), ids_.begin() + std::ptrdiff_t(context_));
  context_ = ids_.size();
  prefix_ = tokenizer_.decode(ids_, skip_special_);
  return out;
}

std::optional<int> config_eos_id(const std::string& dir, const Tokenizer& tokenizer) {
  std::ifstream in(dir + "/tokenizer_config.json");
  if (!in) return std::nullopt;
  const json c = parse_json(std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()),
                            dir + "/tokenizer_config.json");
  if (!c.is_object() || !c.contains("eos_token")) return std::nullopt;
  const json& e = c["eos_token"];
  if (e.is_string()) return tokenizer.token_to_id(e.get<std::string>());
  if (e.is_object() && e.contains("content") && e["content"].is_string()) return tokenizer.token_to_id(e["content"].get<std::string>());
  return std::nullopt;
}

}  // namespace dsv41
