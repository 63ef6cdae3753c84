#pragma once
// Post-processors of tokenizer.json, which add special tokens around an encoded sequence when
// encode() is asked to (add_special_tokens): TemplateProcessing (e.g. "<s> $A </s>"),
// ByteLevel (changes offsets only, so no ids) and Sequence. Only single sequences are encoded
// here, so a template's "pair" part is not used.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dsv41 {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int>& ids) const = 0;
};

std::unique_ptr<PostProcessor> post_processor_from_json(const nlohmann::json& spec, const std::string& where);

}  // namespace dsv41
