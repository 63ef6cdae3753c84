#pragma once
// Typed access to the fields of tokenizer.json components. Every failure names the component
// path (`where`), the field, what was expected and what was found. Included only by the
// tokenizer's .cpp files, which all parse JSON.
#include <nlohmann/json.hpp>
#include <string>

namespace dsv41::json_fields {

using json = nlohmann::json;

// The field, which must be present; null counts as absent.
const json& required(const json& obj, const char* key, const std::string& where);
std::string required_string(const json& obj, const char* key, const std::string& where);

// The field when present and not null, else the default.
std::string optional_string(const json& obj, const char* key, const std::string& dflt, const std::string& where);
bool optional_bool(const json& obj, const char* key, bool dflt, const std::string& where);
int optional_int(const json& obj, const char* key, int dflt, const std::string& where);

// One Unicode character given as a JSON string (Metaspace's replacement, Strip's content).
std::string required_char(const json& obj, const char* key, const std::string& where);

// The component's "type" field, checked to be a string.
std::string type_of(const json& spec, const std::string& where);

// "type 'X'" refused: the message lists the supported types.
[[noreturn]] void unsupported_type(const std::string& where, const std::string& kind, const std::string& type,
                                   const char* supported);

}  // namespace dsv41::json_fields
