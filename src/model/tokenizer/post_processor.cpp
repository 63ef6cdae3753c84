#include "model/tokenizer/post_processor.h"

#include <cstdint>

#include "base/error.h"
#include "model/tokenizer/json_fields.h"

namespace dsv41 {

namespace {

using namespace json_fields;

// The "single" template: the ids of its special tokens before and after the sequence $A.
class Template final : public PostProcessor {
 public:
  Template(std::vector<int> before, std::vector<int> after) : before_(std::move(before)), after_(std::move(after)) {}
  void process(std::vector<int>& ids) const override {
    ids.insert(ids.begin(), before_.begin(), before_.end());
    ids.insert(ids.end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int> before_, after_;
};

class Nothing final : public PostProcessor {
 public:
  void process(std::vector<int>&) const override {}
};

class Sequence final : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(std::vector<int>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

std::unique_ptr<PostProcessor> template_from_json(const json& spec, const std::string& where) {
  const json& single = required(spec, "single", where);
  const json& specials = required(spec, "special_tokens", where);
  if (!single.is_array()) fail(where + ".single", "an array of template pieces", single.dump());
  std::vector<int> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    std::string at = where + ".single[" + std::to_string(i) + "]";
    const json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      std::string id = required_string(piece["Sequence"], "id", at);
      if (id != "A" || seen_sequence) fail(at, "one sequence $A in a single template", piece.dump());
      seen_sequence = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      std::string name = required_string(piece["SpecialToken"], "id", at);
      const json& special = required(specials, name.c_str(), where + ".special_tokens");
      const json& ids = required(special, "ids", where + ".special_tokens['" + name + "']");
      if (!ids.is_array()) fail(where + ".special_tokens['" + name + "'].ids", "an array of ids", ids.dump());
      for (const json& id : ids) {
        // Checked as the 64-bit value stored (2^32 + 5 read as an int is 5; 2^64 − 1 reads as −1).
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
          fail(where + ".special_tokens['" + name + "'].ids", "ids in [0, 2^31)", ids.dump());
        (seen_sequence ? after : before).push_back(id.get<int>());
      }
    } else {
      fail(at, "{\"Sequence\": ...} or {\"SpecialToken\": ...}", piece.dump());
    }
  }
  if (!seen_sequence) fail(where + ".single", "a template with $A", single.dump());
  return std::make_unique<Template>(std::move(before), std::move(after));
}

}  // namespace

std::unique_ptr<PostProcessor> post_processor_from_json(const nlohmann::json& spec, const std::string& where) {
  std::string type = type_of(spec, where);
  if (type == "TemplateProcessing") return template_from_json(spec, where);
  if (type == "ByteLevel") return std::make_unique<Nothing>();
  if (type == "Sequence") {
    const json& list = required(spec, "processors", where);
    if (!list.is_array()) fail(where + ".processors", "an array", list.dump());
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list.size(); ++i)
      steps.push_back(post_processor_from_json(list[i], where + ".processors[" + std::to_string(i) + "]"));
    return std::make_unique<Sequence>(std::move(steps));
  }
  unsupported_type(where, "post_processor", type, "TemplateProcessing, ByteLevel, Sequence");
}

}  // namespace dsv41
