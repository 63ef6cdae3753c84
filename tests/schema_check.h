#pragma once
// An independent check that a JSON value satisfies a JSON Schema of the subset the grammar
// compiler takes (docs/openai-api.md): written from the keywords' definitions, sharing no code
// with engine/grammar, patterns through std::regex (ECMAScript, searched as JSON Schema says).
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

namespace dsv41::test {

inline size_t code_points(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Empty when `v` satisfies `schema` (resolving "#..." references in `root`), else why not.
inline std::string schema_violation(const nlohmann::ordered_json& v, const nlohmann::ordered_json& schema,
                                    const nlohmann::ordered_json& root) {
  using ojson = nlohmann::ordered_json;
  if (schema.is_boolean()) return schema.get<bool>() ? "" : "false schema";
  if (schema.contains("$ref"))
    return schema_violation(v, root.at(ojson::json_pointer(schema["$ref"].get<std::string>().substr(1))), root);
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!schema.contains(key)) continue;
    int matched = 0;
    for (const ojson& option : schema[key]) {
      ojson merged = schema;
      merged.erase(key);
      for (const auto& [k, x] : option.items()) merged[k] = x;
      matched += schema_violation(v, merged, root).empty();
    }
    if (matched == 0) return std::string("no ") + key + " alternative matches " + v.dump();
    if (std::string(key) == "oneOf" && matched > 1) return "more than one oneOf alternative matches " + v.dump();
    return "";
  }
  if (schema.contains("enum")) {
    for (const ojson& e : schema["enum"])
      if (e == v) return "";
    return v.dump() + " is not in the enum";
  }
  if (schema.contains("const")) return schema["const"] == v ? "" : v.dump() + " is not the const";
  if (schema.contains("type")) {
    std::vector<std::string> types;
    if (schema["type"].is_string()) types = {schema["type"].get<std::string>()};
    else for (const ojson& t : schema["type"]) types.push_back(t.get<std::string>());
    bool ok = false;
    for (const std::string& t : types)
      ok = ok || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) || (t == "string" && v.is_string()) ||
           (t == "integer" && v.is_number_integer()) || (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
           (t == "null" && v.is_null());
    if (!ok) return v.dump() + " is not of type " + schema["type"].dump();
  }
  if (v.is_object()) {
    if (schema.contains("required"))
      for (const ojson& r : schema["required"])
        if (!v.contains(r.get<std::string>())) return "missing required " + r.dump();
    for (const auto& [k, x] : v.items()) {
      if (schema.contains("properties") && schema["properties"].contains(k)) {
        if (std::string why = schema_violation(x, schema["properties"][k], root); !why.empty()) return k + ": " + why;
      } else if (schema.contains("additionalProperties")) {
        if (std::string why = schema_violation(x, schema["additionalProperties"], root); !why.empty()) return "additional " + k + ": " + why;
      }
    }
  }
  if (v.is_array()) {
    if (schema.contains("minItems") && v.size() < schema["minItems"].get<size_t>()) return "fewer than minItems";
    if (schema.contains("maxItems") && v.size() > schema["maxItems"].get<size_t>()) return "more than maxItems";
    if (schema.contains("items"))
      for (const ojson& x : v)
        if (std::string why = schema_violation(x, schema["items"], root); !why.empty()) return "item: " + why;
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (schema.contains("minLength") && code_points(s) < schema["minLength"].get<size_t>()) return "shorter than minLength";
    if (schema.contains("maxLength") && code_points(s) > schema["maxLength"].get<size_t>()) return "longer than maxLength";
    if (schema.contains("pattern") && !std::regex_search(s, std::regex(schema["pattern"].get<std::string>(), std::regex::ECMAScript)))
      return v.dump() + " does not match " + schema["pattern"].dump();
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if (schema.contains("minimum") && x < schema["minimum"].get<double>()) return v.dump() + " below minimum";
    if (schema.contains("maximum") && x > schema["maximum"].get<double>()) return v.dump() + " above maximum";
    if (schema.contains("exclusiveMinimum") && x <= schema["exclusiveMinimum"].get<double>()) return v.dump() + " not above exclusiveMinimum";
    if (schema.contains("exclusiveMaximum") && x >= schema["exclusiveMaximum"].get<double>()) return v.dump() + " not below exclusiveMaximum";
  }
  return "";
}

}  // namespace dsv41::test
