#pragma once
// A Hugging Face `tokenizer.json` tokenizer (byte-level BPE as DeepSeek, Qwen and Llama 3 use,
// and SentencePiece-style BPE with Metaspace and byte fallback). The pipeline, the supported
// components and what is refused are in docs/tokenizer.md.
//
//   Tokenizer tok = Tokenizer::from_file("tokenizer.json");
//   std::vector<int> ids = tok.encode("Hello world");
//   std::string text = tok.decode(ids);
//
// A Tokenizer is immutable once built; copies share it, and every method may be called from
// several threads at once.
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv41 {

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  // `where` names the source in error messages (a file name, "<inline>", ...).
  static Tokenizer from_json(const std::string& text, const std::string& where);

  // The ids of `text`. Input that is not valid UTF-8 is read with each invalid sequence as
  // U+FFFD. With add_special_tokens, the post-processor adds its special tokens (BOS/EOS).
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;

  // The text of `ids` through the decoder; ids that name no token contribute nothing (as in
  // HF). skip_special_tokens leaves out added tokens marked special.
  std::string decode(std::span<const int> ids, bool skip_special_tokens = false) const;

  // The token string of an id (an added token's content, or the model's token); throws
  // dsv41::Error for an id that names no token.
  std::string id_to_token(int id) const;
  std::optional<int> token_to_id(std::string_view token) const;
  // Largest id + 1, added tokens included.
  size_t vocab_size() const;
  bool is_special(int id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
  friend class StreamDecoder;
};

// The end-of-sequence id that DIR/tokenizer_config.json names (its eos_token, a string or an
// object with "content"), if the file says and the tokenizer has that token.
std::optional<int> config_eos_id(const std::string& dir, const Tokenizer& tokenizer);

// Decodes ids as a model produces them, one at a time, and returns only complete text: never
// half a UTF-8 character, and never text that a later token could still change. The rule (as
// HF's DecodeStream): the pending ids are decoded together with the ids emitted just before
// them; the text past what was already emitted is returned unless it ends with U+FFFD, which
// is what an unfinished character decodes to; then it waits for more ids. flush() returns
// what is held back at the end of a sequence.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  std::string push(int id);
  std::string flush();

 private:
  std::string emit(bool force);

  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int> ids_;    // context ids (already emitted) followed by pending ids
  size_t context_ = 0;      // how many of ids_ are context
  std::string prefix_;      // decode of the context ids
};

}  // namespace dsv41
