#include "engine/grammar/json_schema.h"

#include <cmath>
#include <optional>
#include <set>

#include "engine/grammar/regex.h"

namespace dsv41::grammar {

using ojson = nlohmann::ordered_json;

namespace {

// Keywords that describe a schema without constraining its values: accepted and ignored.
const std::set<std::string> kAnnotations{"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                         "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict"};

// The keywords each type takes, besides the annotations, "type", "enum" and "const".
const std::set<std::string> kObjectKeywords{"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKeywords{"items", "minItems", "maxItems"};
const std::set<std::string> kStringKeywords{"pattern", "minLength", "maxLength"};
const std::set<std::string> kNumberKeywords{"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

// The longest numerals written where a schema sets no bound: an integer's fits an int64, a
// number's integral part and exponent keep it within a double (a parser may refuse more).
constexpr uint64_t kLargestInteger = 999'999'999'999'999'999ull;
constexpr uint64_t kLargestIntegral = 999'999'999'999'999ull;
constexpr int64_t kExponentDigits = 2;

// The most unrolled repetitions (minItems/maxItems, minLength/maxLength) a schema may ask for.
constexpr int64_t kMaxBound = 1000;

ByteSet byte_range(int lo, int hi) {
  ByteSet s;
  for (int c = lo; c <= hi; ++c) s.set(size_t(c));
  return s;
}

[[noreturn]] void refuse(const std::string& keyword, const std::string& where, const std::string& why) {
  throw SchemaError(keyword, where, why);
}

int64_t bound(const ojson& schema, const char* key, const std::string& where, int64_t fallback) {
  auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxBound)
    refuse(key, where + "/" + key, std::string("expected an integer in [0, ") + std::to_string(kMaxBound) + "], found " + it->dump());
  return it->get<int64_t>();
}

// Equal-length digit strings a <= b: every number between them, digit by digit.
Fragment same_length(Nfa& nfa, const std::string& a, const std::string& b) {
  if (a.empty()) return nfa.empty();
  const std::string rest_a = a.substr(1), rest_b = b.substr(1);
  auto digits_any = [&](size_t n) {
    return nfa.repeat([&] { return nfa.bytes(byte_range('0', '9')); }, int64_t(n), int64_t(n));
  };
  if (a[0] == b[0]) return nfa.seq(nfa.byte(uint8_t(a[0])), same_length(nfa, rest_a, rest_b));
  if (rest_a.find_first_not_of('0') == std::string::npos && rest_b.find_first_not_of('9') == std::string::npos)
    return nfa.seq(nfa.bytes(byte_range(a[0], b[0])), digits_any(rest_a.size()));
  std::vector<Fragment> options{nfa.seq(nfa.byte(uint8_t(a[0])), same_length(nfa, rest_a, std::string(rest_a.size(), '9')))};
  if (a[0] + 1 <= b[0] - 1) options.push_back(nfa.seq(nfa.bytes(byte_range(a[0] + 1, b[0] - 1)), digits_any(rest_a.size())));
  options.push_back(nfa.seq(nfa.byte(uint8_t(b[0])), same_length(nfa, std::string(rest_b.size(), '0'), rest_b)));
  return nfa.alt(options);
}

// The decimal numerals (no leading zeros) of lo..hi.
Fragment natural_range(Nfa& nfa, uint64_t lo, uint64_t hi) {
  const std::string a = std::to_string(lo);
  const size_t last = std::to_string(hi).size();
  std::vector<Fragment> options;
  for (size_t len = a.size(); len <= last; ++len) {
    const std::string from = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string to = len == last ? std::to_string(hi) : std::string(len, '9');
    options.push_back(same_length(nfa, from, to));
  }
  return nfa.alt(options);
}

}  // namespace

SchemaCompiler::SchemaCompiler(Nfa& nfa, const ojson& root, bool no_angle) : nfa_(nfa), root_(root), no_angle_(no_angle) {}

Fragment SchemaCompiler::value(const ojson& schema, const std::string& where) {
  if (schema.is_boolean()) {
    if (!schema.get<bool>()) refuse("false", where, "the schema false admits no value");
    return any_value(kAnyDepth);
  }
  if (!schema.is_object()) refuse("type", where, "expected a schema (an object or a boolean), found " + std::string(schema.type_name()));
  if (auto ref = schema.find("$ref"); ref != schema.end()) {
    if (!ref->is_string() || ref->get<std::string>().rfind("#", 0) != 0)
      refuse("$ref", where + "/$ref", "expected a reference inside the schema (\"#/$defs/...\"), found " + ref->dump());
    const std::string pointer = ref->get<std::string>().substr(1);
    if (std::find(refs_.begin(), refs_.end(), pointer) != refs_.end())
      refuse("$ref", where + "/$ref", "a recursive reference to #" + pointer + " (recursive schemas are not supported)");
    const ojson* target;
    try {
      target = &root_.at(ojson::json_pointer(pointer));
    } catch (const std::exception&) {
      refuse("$ref", where + "/$ref", "a reference to nothing: #" + pointer);
    }
    for (const auto& [key, v] : schema.items())
      if (key != "$ref" && !kAnnotations.count(key)) refuse(key, where + "/" + key, "keywords beside \"$ref\" are not supported");
    refs_.push_back(pointer);
    Fragment f = value(*target, "#" + pointer);
    refs_.pop_back();
    return f;
  }
  for (const char* combinator : {"anyOf", "oneOf"}) {
    auto it = schema.find(combinator);
    if (it == schema.end()) continue;
    if (!it->is_array() || it->empty()) refuse(combinator, where + "/" + combinator, "expected a non-empty array of schemas");
    // Each alternative with the schema's other keywords (its own winning).
    std::vector<Fragment> options;
    for (size_t i = 0; i < it->size(); ++i) {
      ojson merged = schema;
      merged.erase(combinator);
      const ojson& option = (*it)[i];
      if (option.is_object())
        for (const auto& [key, v] : option.items()) merged[key] = v;
      else if (merged.size() == 0 || option.is_boolean())
        merged = option;
      options.push_back(value(merged, where + "/" + combinator + "/" + std::to_string(i)));
    }
    return nfa_.alt(options);
  }
  if (auto it = schema.find("allOf"); it != schema.end()) {
    if (!it->is_array() || it->size() != 1) refuse("allOf", where + "/allOf", "allOf of more than one schema is not supported");
    ojson merged = schema;
    merged.erase("allOf");
    for (const auto& [key, v] : (*it)[0].items()) merged[key] = v;
    return value(merged, where);
  }
  for (const char* key : {"enum", "const"}) {
    auto it = schema.find(key);
    if (it == schema.end()) continue;
    const ojson values = std::string(key) == "const" ? ojson::array({*it}) : *it;
    if (!values.is_array() || values.empty()) refuse(key, where + "/" + key, "expected a non-empty array of values");
    std::vector<Fragment> options;
    for (const ojson& v : values) {
      const std::string text = v.dump();
      if (no_angle_ && text.find('<') != std::string::npos) refuse(key, where + "/" + key, "a value with '<' inside a tool call");
      options.push_back(nfa_.literal(text));
    }
    return nfa_.alt(options);
  }
  auto type = schema.find("type");
  std::vector<std::string> types;
  if (type == schema.end()) {
    // No type: what the keywords imply, else any value.
    if (schema.contains("properties") || schema.contains("additionalProperties")) types = {"object"};
    else if (schema.contains("items")) types = {"array"};
    else if (schema.contains("pattern") || schema.contains("minLength") || schema.contains("maxLength")) types = {"string"};
    else {
      for (const auto& [key, v] : schema.items())
        if (!kAnnotations.count(key)) refuse(key, where + "/" + key, "\"" + key + "\" without a \"type\" is not supported");
      return any_value(kAnyDepth);
    }
  } else if (type->is_string()) {
    types = {type->get<std::string>()};
  } else if (type->is_array() && !type->empty()) {
    for (const ojson& t : *type) {
      if (!t.is_string()) refuse("type", where + "/type", "expected type names, found " + t.dump());
      types.push_back(t.get<std::string>());
    }
  } else {
    refuse("type", where + "/type", "expected a type name or an array of them, found " + type->dump());
  }
  std::vector<Fragment> options;
  for (const std::string& t : types) options.push_back(typed(schema, t, where));
  return options.size() == 1 ? options[0] : nfa_.alt(options);
}

Fragment SchemaCompiler::typed(const ojson& schema, const std::string& type, const std::string& where) {
  static const std::set<std::string> kTypes{"object", "array", "string", "integer", "number", "boolean", "null"};
  if (!kTypes.count(type))
    refuse("type", where + "/type", "expected object, array, string, integer, number, boolean or null, found \"" + type + "\"");
  // A keyword of another type does not apply to this one (JSON Schema's rule); an unknown one is refused.
  for (const auto& [key, v] : schema.items()) {
    if (key == "type" || kAnnotations.count(key)) continue;
    const bool known = kObjectKeywords.count(key) || kArrayKeywords.count(key) || kStringKeywords.count(key) || kNumberKeywords.count(key);
    if (!known) refuse(key, where + "/" + key, "the keyword \"" + key + "\" is not supported");
  }
  if (type == "object") return object(schema, where);
  if (type == "array") return array(schema, where);
  if (type == "string") return string(schema, where, StringStyle::json);
  if (type == "integer") return integer(schema, where);
  if (type == "number") return number(schema, where);
  if (type == "boolean") return nfa_.alt(std::vector<Fragment>{nfa_.literal("true"), nfa_.literal("false")});
  return nfa_.literal("null");
}

// Properties in the schema's order, the required ones always, each optional one present or
// not. Two tracks of states: `none` (nothing written yet: the next property has no comma) and
// `some`; a property's value is shared by both (it always leads to `some`).
Fragment SchemaCompiler::object(const ojson& schema, const std::string& where) {
  auto props = schema.find("properties");
  auto additional = schema.find("additionalProperties");
  if (props == schema.end() || props->empty()) {
    if (additional == schema.end() || (additional->is_boolean() && additional->get<bool>())) return any_object(kAnyDepth);
    if (additional->is_boolean()) return nfa_.literal("{}");
    // A map: any keys, each value of the one schema.
    const Fragment start = nfa_.literal("{"), end = nfa_.literal("}");
    const int loop = nfa_.add_state();
    Fragment entry = nfa_.seq({string(ojson::object(), where, StringStyle::json), nfa_.literal(":"),
                               value(*additional, where + "/additionalProperties")});
    nfa_.epsilon(start.end, end.start);
    nfa_.epsilon(start.end, entry.start);
    nfa_.epsilon(entry.end, loop);
    nfa_.epsilon(loop, end.start);
    const Fragment comma = nfa_.literal(",");
    nfa_.epsilon(loop, comma.start);
    nfa_.epsilon(comma.end, entry.start);
    return {start.start, end.end};
  }
  if (!props->is_object()) refuse("properties", where + "/properties", "expected an object of schemas, found " + props->dump());
  std::set<std::string> required;
  if (auto r = schema.find("required"); r != schema.end()) {
    if (!r->is_array()) refuse("required", where + "/required", "expected an array of property names, found " + r->dump());
    for (const ojson& name : *r) {
      if (!name.is_string() || !props->contains(name.get<std::string>()))
        refuse("required", where + "/required", "a name that is not a property: " + name.dump());
      required.insert(name.get<std::string>());
    }
  }
  if (additional != schema.end() && !additional->is_boolean() && !(additional->is_object() && additional->empty()))
    refuse("additionalProperties", where + "/additionalProperties", "a schema for additional properties beside \"properties\" is not supported (only false, true or {}; none are generated)");
  const Fragment open = nfa_.literal("{");
  int none = open.end, some = nfa_.add_state();
  bool any_written = false;  // whether `some` can be reached yet
  for (const auto& [name, sub] : props->items()) {
    const std::string key = ojson(name).dump();
    const Fragment v = value(sub, where + "/properties/" + name);
    const int next_none = nfa_.add_state(), next_some = nfa_.add_state();
    const Fragment first = nfa_.literal(key + ":");
    nfa_.epsilon(none, first.start);
    nfa_.epsilon(first.end, v.start);
    if (any_written) {
      const Fragment later = nfa_.literal("," + key + ":");
      nfa_.epsilon(some, later.start);
      nfa_.epsilon(later.end, v.start);
    }
    nfa_.epsilon(v.end, next_some);
    if (!required.count(name)) {
      nfa_.epsilon(none, next_none);
      if (any_written) nfa_.epsilon(some, next_some);
    }
    none = next_none;
    some = next_some;
    any_written = true;
  }
  const Fragment close = nfa_.literal("}");
  nfa_.epsilon(none, close.start);
  nfa_.epsilon(some, close.start);
  return {open.start, close.end};
}

Fragment SchemaCompiler::array(const ojson& schema, const std::string& where) {
  const int64_t min = bound(schema, "minItems", where, 0), max = bound(schema, "maxItems", where, -1);
  if (max >= 0 && max < min) refuse("maxItems", where + "/maxItems", "maxItems below minItems");
  const ojson items = schema.contains("items") ? schema.at("items") : ojson(true);
  const std::string at = where + "/items";
  if (max == 0) return nfa_.literal("[]");
  Fragment open = nfa_.literal("[");
  // The first item, then the rest each after a comma.
  Fragment elements = nfa_.seq(value(items, at),
                               nfa_.repeat([&] { return nfa_.seq(nfa_.literal(","), value(items, at)); }, std::max<int64_t>(min - 1, 0),
                                           max < 0 ? -1 : max - 1));
  if (min == 0) elements = nfa_.optional(elements);
  return nfa_.seq({open, elements, nfa_.literal("]")});
}

Fragment SchemaCompiler::string_char(StringStyle style) {
  if (style == StringStyle::raw) {
    ByteSet set = byte_range(0x20, 0x7F);
    set.set('\t'), set.set('\n'), set.set('\r'), set.reset('<');
    return nfa_.alt(std::vector<Fragment>{nfa_.bytes(set), utf8_multibyte(nfa_)});
  }
  ByteSet set = byte_range(0x20, 0x7F);
  set.reset('"'), set.reset('\\');
  if (no_angle_) set.reset('<');
  ByteSet simple_escapes;
  for (char c : std::string_view("\"\\/bfnrt")) simple_escapes.set(uint8_t(c));
  const ByteSet hex = byte_range('0', '9') | byte_range('a', 'f') | byte_range('A', 'F');
  const Fragment escape = nfa_.seq(nfa_.literal("\\"), nfa_.alt(std::vector<Fragment>{
                                                           nfa_.bytes(simple_escapes),
                                                           nfa_.seq({nfa_.literal("u"), nfa_.bytes(hex), nfa_.bytes(hex), nfa_.bytes(hex), nfa_.bytes(hex)})}));
  return nfa_.alt(std::vector<Fragment>{nfa_.bytes(set), utf8_multibyte(nfa_), escape});
}

Fragment SchemaCompiler::raw_string(const ojson& schema, const std::string& where) {
  for (const auto& [key, v] : schema.items())
    if (key != "type" && !kAnnotations.count(key) && !kStringKeywords.count(key))
      refuse(key, where + "/" + key, "the keyword \"" + key + "\" is not supported on a string");
  return string(schema, where, StringStyle::raw);
}

Fragment SchemaCompiler::string(const ojson& schema, const std::string& where, StringStyle style) {
  const int64_t min = bound(schema, "minLength", where, 0), max = bound(schema, "maxLength", where, -1);
  if (max >= 0 && max < min) refuse("maxLength", where + "/maxLength", "maxLength below minLength");
  Fragment body;
  if (auto p = schema.find("pattern"); p != schema.end()) {
    if (!p->is_string()) refuse("pattern", where + "/pattern", "expected a string, found " + p->dump());
    if (schema.contains("minLength") || schema.contains("maxLength"))
      refuse("pattern", where + "/pattern", "a pattern together with minLength or maxLength is not supported (write the length into the pattern)");
    Regex regex = [&] {
      try {
        return Regex::parse(p->get<std::string>());
      } catch (const Error& e) {
        refuse("pattern", where + "/pattern", e.what());
      }
    }();
    // A pattern's characters are written as they are: no escapes, so no '"' or '\\' (and, raw, no '<').
    ByteSet set = byte_range(0x20, 0x7F);
    if (style == StringStyle::json) set.reset('"'), set.reset('\\');
    if (style == StringStyle::raw || no_angle_) set.reset('<');
    if (style == StringStyle::raw) set.set('\t'), set.set('\n'), set.set('\r');
    body = regex.emit(nfa_, set);
  } else {
    body = nfa_.repeat([&] { return string_char(style); }, min, max);
  }
  if (style == StringStyle::raw) return body;
  return nfa_.seq({nfa_.literal("\""), body, nfa_.literal("\"")});
}

// An integer's bounds as integers: minimum/maximum, exclusive ones one step inside.
Fragment SchemaCompiler::integer(const ojson& schema, const std::string& where) {
  std::optional<int64_t> lo, hi;
  auto read = [&](const char* key, bool upper, bool exclusive) {
    auto it = schema.find(key);
    if (it == schema.end()) return;
    if (!it->is_number() || std::abs(it->get<double>()) > 1e15)
      refuse(key, where + "/" + key, "expected a number within ±1e15, found " + it->dump());
    const double x = it->get<double>();
    int64_t b = upper ? int64_t(std::floor(x)) : int64_t(std::ceil(x));
    if (exclusive && double(b) == x) b += upper ? -1 : 1;
    if (upper) hi = hi ? std::min(*hi, b) : b;
    else lo = lo ? std::max(*lo, b) : b;
  };
  read("minimum", false, false);
  read("exclusiveMinimum", false, true);
  read("maximum", true, false);
  read("exclusiveMaximum", true, true);
  if (lo && hi && *lo > *hi) refuse("minimum", where, "no integer lies between the schema's minimum and maximum");
  std::vector<Fragment> options;
  if (!lo || *lo < 0) {  // the negative ones in [lo, min(hi, -1)]: "-" and their magnitudes
    const uint64_t from = hi && *hi < 0 ? uint64_t(-*hi) : 1;
    const uint64_t to = lo ? uint64_t(-*lo) : kLargestInteger;
    options.push_back(nfa_.seq(nfa_.literal("-"), natural_range(nfa_, from, to)));
  }
  if (!hi || *hi >= 0) options.push_back(natural_range(nfa_, uint64_t(lo && *lo > 0 ? *lo : 0), hi ? uint64_t(*hi) : kLargestInteger));
  return options.size() == 1 ? options[0] : nfa_.alt(options);
}

Fragment SchemaCompiler::number(const ojson& schema, const std::string& where) {
  for (const std::string& key : kNumberKeywords)
    if (schema.contains(key))
      refuse(key, where + "/" + key, "\"" + key + "\" on a number is not supported (it is on an integer)");
  const Fragment digits = nfa_.repeat([&] { return nfa_.bytes(byte_range('0', '9')); }, 1, -1);
  const Fragment integral = natural_range(nfa_, 0, kLargestIntegral);
  ByteSet e, sign;
  e.set('e'), e.set('E'), sign.set('+'), sign.set('-');
  return nfa_.seq({nfa_.optional(nfa_.literal("-")), integral,
                   nfa_.optional(nfa_.seq(nfa_.literal("."), digits)),
                   nfa_.optional(nfa_.seq({nfa_.bytes(e), nfa_.optional(nfa_.bytes(sign)),
                                           nfa_.repeat([&] { return nfa_.bytes(byte_range('0', '9')); }, 1, kExponentDigits)}))});
}

// Objects and arrays of any values, nested at most `depth` deep. Each container's elements loop
// through one copy of the value (an entry, then a comma back to it or the end).
Fragment SchemaCompiler::any_object(int depth) {
  const Fragment start = nfa_.literal("{"), end = nfa_.literal("}");
  nfa_.epsilon(start.end, end.start);
  if (depth > 0) {
    Fragment entry = nfa_.seq({string(ojson::object(), "", StringStyle::json), nfa_.literal(":"), any_value(depth - 1)});
    const Fragment comma = nfa_.literal(",");
    nfa_.epsilon(start.end, entry.start);
    nfa_.epsilon(entry.end, end.start);
    nfa_.epsilon(entry.end, comma.start);
    nfa_.epsilon(comma.end, entry.start);
  }
  return {start.start, end.end};
}

Fragment SchemaCompiler::any_value(int depth) {
  std::vector<Fragment> options{nfa_.literal("null"), nfa_.literal("true"), nfa_.literal("false"),
                                number(ojson::object(), ""), string(ojson::object(), "", StringStyle::json)};
  if (depth > 0) {
    options.push_back(any_object(depth - 1));
    const Fragment start = nfa_.literal("["), end = nfa_.literal("]");
    Fragment element = any_value(depth - 1);
    const Fragment comma = nfa_.literal(",");
    nfa_.epsilon(start.end, end.start);
    nfa_.epsilon(start.end, element.start);
    nfa_.epsilon(element.end, end.start);
    nfa_.epsilon(element.end, comma.start);
    nfa_.epsilon(comma.end, element.start);
    options.push_back({start.start, end.end});
  }
  return nfa_.alt(options);
}

}  // namespace dsv41::grammar
