#pragma once
// The project's tokenizer as Hugging Face files (docs/training-data.md, "Tokenizer"):
// tokenizer.json (a byte-level BPE model with DeepSeek-V3's pre-tokenizer, the chat format's
// markers as added tokens, BOS added by the post-processor) and tokenizer_config.json, which
// dsv41's Tokenizer and transformers.js both read.
//
// Ids: 0..8 the added tokens below, 9..264 the 256 bytes in byte order, then the merged symbols
// in the order the merges made them.
#include <array>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "engine/chat_format.h"
#include "train/data/bpe_trainer.h"

namespace dsv41::train {

struct AddedToken {
  std::string_view content;
  bool special;  // left out by decode(skip_special_tokens); as DeepSeek-V3: BOS, EOS and PAD only
};

inline constexpr std::string_view kPad = "<｜▁pad▁｜>";
inline constexpr std::array<AddedToken, 9> kAddedTokens = {{
    {chat_token::kBos, true},         // 0
    {chat_token::kEos, true},         // 1
    {kPad, true},                     // 2
    {chat_token::kSystem, false},     // 3
    {chat_token::kUser, false},       // 4
    {chat_token::kAssistant, false},  // 5
    {chat_token::kThinkStart, false}, // 6
    {chat_token::kThinkEnd, false},   // 7
    {chat_token::kDsml, false},       // 8
}};
inline constexpr int kBosId = 0, kEosId = 1, kPadId = 2;
inline constexpr int kFirstByteId = int(kAddedTokens.size());

// The pre_tokenizer of DeepSeek-V3's tokenizer.json: digits in groups of at most three, runs of
// CJK characters, GPT-style words, punctuation and whitespace (one regex), then the byte-level
// alphabet.
const nlohmann::json& pre_tokenizer_spec();

// tokenizer.json for `model` ("\n"-terminated; the same model gives the same bytes).
std::string tokenizer_json(const BpeModel& model);
std::string tokenizer_config_json();

}  // namespace dsv41::train
