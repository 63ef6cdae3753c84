#pragma once
// JSON documents as dsv41 reads them from disk (config.json, a safetensors header, the shard
// index, tokenizer.json, tokenizer_config.json): at most kJsonDepth levels deep, each key once in
// an object, every number within double's range. nlohmann's own parse builds any depth and keeps
// the last of repeated keys; whatever walks a value afterwards recurses (an error message's
// dump()), so a 200 KB header of brackets overflowed the stack, and a second "model" key silently
// replaced a tokenizer's vocabulary.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace dsv41 {

// The deepest of these files nests 8 levels (a tokenizer's normalizer sequences).
inline constexpr int kJsonDepth = 64;

// Parses `text`, or throws dsv41::Error naming `where`: "where: expected valid JSON, found ..."
// (a syntax error, a number out of range), "... nested at most 64 levels deep, found deeper
// nesting", "... with each key once in an object, found key "k" twice".
nlohmann::json parse_json(std::string_view text, const std::string& where);

}  // namespace dsv41
