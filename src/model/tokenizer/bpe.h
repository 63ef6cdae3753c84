#pragma once
// The BPE model of tokenizer.json: a vocabulary of strings and a ranked list of merges. A word
// starts as one symbol per character and the adjacent pair of lowest rank is merged until no
// pair is in the merge list (the leftmost pair first among equal ranks), as HF tokenizers does.
//
// Options: unk_token (+ fuse_unk), byte_fallback (<0xXX> tokens for characters not in the
// vocabulary), continuing_subword_prefix, end_of_word_suffix, and ignore_merges (a word that is
// itself in the vocabulary is taken whole). Dropout is refused: it makes encoding random.
//
// Speed: merges live in an open-addressing table keyed by the pair of ids, and the ids of
// recent words are cached (bounded, shared between threads, never blocking).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv41 {

// std::hash<std::string_view> for maps keyed by std::string, so that look-ups by string_view
// need no temporary string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

// Token ids a tokenizer.json may use: below 4 × the tokens it lists + 1024, so that an id -> token
// table is at most a few times the size of the file that fills it.
inline constexpr const char* kTokenIdLimitRule = "below 4 × the tokens listed + 1024";
inline int64_t token_id_limit(int64_t entries) { return 4 * entries + 1024; }

class BpeModel {
 public:
  static std::unique_ptr<BpeModel> from_json(const nlohmann::json& spec, const std::string& where);
  ~BpeModel();

  // Appends the ids of one word (a piece from the pre-tokenizer) to `out`.
  void tokenize(std::string_view word, std::vector<int>& out) const;

  std::optional<int> token_to_id(std::string_view token) const;
  // The token of `id`, or null when the vocabulary has no such id.
  const std::string* id_to_token(int id) const;
  // The largest id in the vocabulary (-1 when empty).
  int max_id() const { return int(tokens_.size()) - 1; }
  size_t size() const { return vocab_.size(); }  // the tokens of the vocabulary

 private:
  struct MergeTable;
  class WordCache;

  BpeModel();
  // The id of a string of the vocabulary, or -1.
  int symbol_id(std::string_view s) const;
  void merge_word(std::string_view word, std::vector<int>& out) const;

  StringIdMap vocab_;
  std::vector<std::string> tokens_;  // by id
  std::vector<bool> has_id_;         // ids may have holes
  std::vector<int32_t> char_id_;     // id of each one-character token below U+0800, for speed
  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<WordCache> cache_;
  std::optional<int> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::string prefix_, suffix_;  // continuing_subword_prefix, end_of_word_suffix
  int byte_ids_[256];            // ids of <0x00>..<0xFF> for byte_fallback, -1 if absent
};

}  // namespace dsv41
