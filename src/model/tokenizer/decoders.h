#pragma once
// Decoders of tokenizer.json: ByteLevel, Metaspace, Replace, Strip, Fuse, ByteFallback and
// Sequence. A decoder turns the list of token strings into a list of text pieces, which
// Tokenizer::decode concatenates (HF's decode_chain).
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv41 {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

std::unique_ptr<Decoder> decoder_from_json(const nlohmann::json& spec, const std::string& where);

}  // namespace dsv41
