#include "train/data/tokenizer_json.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/tokenizer/byte_level.h"

namespace dsv41::train {

namespace {

using ojson = nlohmann::ordered_json;

std::string mapped(std::string_view bytes) {
  std::string out;
  byte_level::append_mapped(bytes, out);
  return out;
}

}  // namespace

const nlohmann::json& pre_tokenizer_spec() {
  static const nlohmann::json spec = [] {
    auto split = [](const char* regex) {
      return nlohmann::json{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
    };
    return nlohmann::json{
        {"type", "Sequence"},
        {"pretokenizers",
         {split("\\p{N}{1,3}"), split("[一-龥぀-ゟ゠-ヿ]+"),
          split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
                "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"),
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  }();
  return spec;
}

std::string tokenizer_json(const BpeModel& model) {
  ojson added = ojson::array();
  ojson vocab = ojson::object();
  for (size_t i = 0; i < kAddedTokens.size(); ++i) {
    const std::string content(kAddedTokens[i].content);
    added.push_back({{"id", i}, {"content", content}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", kAddedTokens[i].special}});
    vocab[content] = i;
  }
  std::vector<std::string> names;  // each symbol's vocabulary string
  for (size_t s = 0; s < model.symbols.size(); ++s) {
    names.push_back(mapped(model.symbols[s]));
    if (vocab.contains(names.back())) fail("tokenizer.json", "symbols distinct from the added tokens", "\"" + names.back() + "\" twice");
    vocab[names.back()] = kFirstByteId + s;
  }
  ojson merges = ojson::array();
  for (const BpeModel::Merge& m : model.merges) merges.push_back({names[size_t(m.left)], names[size_t(m.right)]});

  const std::string bos(chat_token::kBos);
  const ojson bos_piece = {{"SpecialToken", {{"id", bos}, {"type_id", 0}}}};
  const ojson post = {
      {"type", "TemplateProcessing"},
      {"single", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair", {bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, bos_piece, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens", {{bos, {{"id", bos}, {"ids", {kBosId}}, {"tokens", {bos}}}}}}};
  const ojson t = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", ojson::parse(pre_tokenizer_spec().dump())},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
        {"vocab", vocab}, {"merges", merges}}}};
  return t.dump() + "\n";
}

std::string tokenizer_config_json() {
  const ojson c = {{"add_bos_token", true},
                   {"add_eos_token", false},
                   {"bos_token", std::string(chat_token::kBos)},
                   {"eos_token", std::string(chat_token::kEos)},
                   {"pad_token", std::string(kPad)},
                   {"clean_up_tokenization_spaces", false},
                   {"model_max_length", 1 << 20},
                   {"tokenizer_class", "PreTrainedTokenizerFast"}};
  return c.dump(2) + "\n";
}

}  // namespace dsv41::train
