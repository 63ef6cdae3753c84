#pragma once
// JSON Schema to a byte automaton (nfa.h) of the JSON texts it admits, written compactly (no
// whitespace between tokens), object properties in the schema's order. The subset, and what is
// refused, are listed in docs/openai-api.md ("Structured output"); a schema outside it throws
// SchemaError naming the keyword.
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/grammar/nfa.h"

namespace dsv41::grammar {

struct SchemaError : Error {
  SchemaError(std::string keyword, const std::string& where, const std::string& why)
      : Error(where + ": " + why), keyword(std::move(keyword)) {}
  std::string keyword;  // the JSON Schema keyword refused
};

// How a string is written: inside a JSON text (quoted, escapes allowed), or raw, as a tool
// call's string parameter is (unquoted, unescaped; its text may hold no '<', which could start
// the parameter's end tag).
enum class StringStyle { json, raw };

class SchemaCompiler {
 public:
  // `root` is the schema that "$ref": "#..." pointers resolve in. `no_angle`: JSON strings hold
  // no '<' either (a tool call's JSON arguments, which sit inside markup).
  SchemaCompiler(Nfa& nfa, const nlohmann::ordered_json& root, bool no_angle = false);

  // The JSON texts of `schema`'s values; `where` names it in errors (a JSON pointer).
  Fragment value(const nlohmann::ordered_json& schema, const std::string& where);
  // The raw text of a string schema's values (StringStyle::raw).
  Fragment raw_string(const nlohmann::ordered_json& schema, const std::string& where);
  // Any JSON value nested at most `depth` levels, and any object so nested.
  Fragment any_value(int depth);
  Fragment any_object(int depth);

  // The deepest nesting that an unconstrained value ("type" missing, json_object) may have.
  static constexpr int kAnyDepth = 5;

 private:
  Fragment typed(const nlohmann::ordered_json& schema, const std::string& type, const std::string& where);
  Fragment object(const nlohmann::ordered_json& schema, const std::string& where);
  Fragment array(const nlohmann::ordered_json& schema, const std::string& where);
  Fragment string(const nlohmann::ordered_json& schema, const std::string& where, StringStyle style);
  Fragment integer(const nlohmann::ordered_json& schema, const std::string& where);
  Fragment number(const nlohmann::ordered_json& schema, const std::string& where);
  Fragment string_char(StringStyle style);
  Fragment digits(int64_t min, int64_t max);

  Nfa& nfa_;
  const nlohmann::ordered_json& root_;
  bool no_angle_;
  std::vector<std::string> refs_;  // the $refs being expanded (a recursive one is refused)
};

}  // namespace dsv41::grammar
