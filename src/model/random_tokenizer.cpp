#include "model/random_tokenizer.h"

#include <nlohmann/json.hpp>
#include <vector>

#include "base/error.h"

namespace dsv41 {

namespace {

using json = nlohmann::json;

const char* kBos = "<｜begin▁of▁sentence｜>";
const char* kEos = "<｜end▁of▁sentence｜>";
const char* kPad = "<｜▁pad▁｜>";

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the others are shifted to
// U+0100 and up so that every byte is one visible character.
std::vector<std::string> byte_symbols() {
  std::vector<std::string> symbols(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s += char(cp);
    } else {
      s += char(0xC0 | (cp >> 6));
      s += char(0x80 | (cp & 0x3F));
    }
    symbols[size_t(b)] = s;
  }
  return symbols;
}

}  // namespace

std::string random_tokenizer_json(int64_t vocab_size) {
  const std::vector<std::string> bytes = byte_symbols();
  const int64_t base = 3 + 256;
  if (vocab_size < base) fail("random tokenizer", "a vocabulary of at least " + std::to_string(base) + " tokens", std::to_string(vocab_size));

  json vocab = json::object();
  vocab[kBos] = 0;
  vocab[kEos] = 1;
  vocab[kPad] = 2;
  for (int b = 0; b < 256; ++b) vocab[bytes[size_t(b)]] = 3 + b;

  // Merges over a small alphabet (space, letters, digits): first every pair, then every merged
  // token extended by one more letter, and so on, until the vocabulary is full.
  std::vector<std::string> alphabet = {bytes[' ']};
  for (char ch = 'a'; ch <= 'z'; ++ch) alphabet.push_back(std::string(1, ch));
  for (char ch = 'A'; ch <= 'Z'; ++ch) alphabet.push_back(std::string(1, ch));
  for (char ch = '0'; ch <= '9'; ++ch) alphabet.push_back(std::string(1, ch));
  json merges = json::array();
  std::vector<std::string> level = alphabet, next_level;
  int64_t id = base;
  while (id < vocab_size) {
    next_level.clear();
    for (const std::string& left : level)
      for (const std::string& right : alphabet) {
        if (id >= vocab_size) break;
        merges.push_back(json::array({left, right}));
        vocab[left + right] = id++;
        next_level.push_back(left + right);
      }
    level = next_level;
  }

  json added = json::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", i}, {"content", i == 0 ? kBos : i == 1 ? kEos : kPad}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  json bos = {{"SpecialToken", {{"id", kBos}, {"type_id", 0}}}};
  json post = {{"type", "TemplateProcessing"},
               {"single", json::array({bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
               {"pair", json::array({bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
               {"special_tokens", {{kBos, {{"id", kBos}, {"ids", {0}}, {"tokens", {kBos}}}}}}};
  json t = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", added},
            {"normalizer", nullptr},
            {"pre_tokenizer", byte_level},
            {"post_processor", post},
            {"decoder", byte_level},
            {"model",
             {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
              {"vocab", vocab}, {"merges", merges}}}};
  return t.dump() + "\n";
}

std::string random_tokenizer_config_json() {
  json c = {{"add_bos_token", true},        {"add_eos_token", false}, {"bos_token", kBos},
            {"eos_token", kEos},            {"pad_token", kPad},      {"tokenizer_class", "PreTrainedTokenizerFast"},
            {"clean_up_tokenization_spaces", false}};
  return c.dump(2) + "\n";
}

}  // namespace dsv41
