#include "model/tokenizer/json_fields.h"

#include "base/error.h"
#include "model/tokenizer/unicode.h"

namespace dsv41::json_fields {

namespace {

std::string field_where(const std::string& where, const char* key) { return where + "." + key; }

}  // namespace

const json& required(const json& obj, const char* key, const std::string& where) {
  if (!obj.is_object()) fail(where, "a JSON object", obj.dump());
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) fail(where, std::string("field '") + key + "'", "none");
  return *it;
}

std::string required_string(const json& obj, const char* key, const std::string& where) {
  const json& v = required(obj, key, where);
  if (!v.is_string()) fail(field_where(where, key), "a string", v.dump());
  return v.get<std::string>();
}

std::string optional_string(const json& obj, const char* key, const std::string& dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_string()) fail(field_where(where, key), "a string", it->dump());
  return it->get<std::string>();
}

bool optional_bool(const json& obj, const char* key, bool dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail(field_where(where, key), "true or false", it->dump());
  return it->get<bool>();
}

int optional_int(const json& obj, const char* key, int dflt, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 30))
    fail(field_where(where, key), "a non-negative integer", it->dump());
  return it->get<int>();
}

std::string required_char(const json& obj, const char* key, const std::string& where) {
  std::string s = required_string(obj, key, where);
  char32_t cp;
  if (s.empty() || !unicode::is_valid_utf8(s) || size_t(unicode::decode(s, 0, cp)) != s.size())
    fail(field_where(where, key), "exactly one character", "'" + s + "'");
  return s;
}

std::string type_of(const json& spec, const std::string& where) { return required_string(spec, "type", where); }

void unsupported_type(const std::string& where, const std::string& kind, const std::string& type,
                      const char* supported) {
  fail(where + ": " + kind + " type '" + type + "'", std::string("one of ") + supported, "'" + type + "'");
}

}  // namespace dsv41::json_fields
