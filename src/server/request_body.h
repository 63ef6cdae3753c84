#pragma once
// A request body's JSON, read once through nlohmann's SAX interface: the document, with at most
// one top-level array of token ids (the completions' "prompt", detokenize's "tokens") read
// straight into integers instead of one JSON value per id. A 32K-token prompt built as JSON values
// cost ~5 ms to build and free, on the critical path of every cached agent turn.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv41 {

struct RequestBody {
  nlohmann::ordered_json json;  // the array read apart, if any, is left here empty
  // The top-level array under the ids key, when every element is an integer >= 0; otherwise it
  // stays in `json` as usual.
  std::optional<std::vector<uint64_t>> ids;
};

// Throws ApiError 400 "invalid_json" for text that is not JSON (a syntax error, a number no double
// holds) or nests arrays and objects deeper than max_depth (refused by a scan of the bytes before
// anything is built).
RequestBody read_body(std::string_view text, int max_depth, const char* ids_key = nullptr);

}  // namespace dsv41
