#include "server/request_body.h"

#include <algorithm>
#include <string>
#include <utility>

#include "server/openai_api.h"

namespace dsv41 {
namespace {

using ojson = nlohmann::ordered_json;

// The deepest nesting of arrays and objects in `text`, the outermost counted as 1 (brackets inside
// strings do not count), stopping as soon as it passes `limit`.
int nesting(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char ch : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (ch == '\\') escaped = true;
      else if (ch == '"') in_string = false;
    } else if (ch == '"') {
      in_string = true;
    } else if (ch == '[' || ch == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if (ch == ']' || ch == '}') {
      --depth;
    }
  }
  return deepest;
}

// The document as nlohmann's own parser builds it (a repeated key: the last one), except the
// top-level array under ids_key, whose unsigned integers go to `ids` until an element of another
// kind turns them back into JSON values.
class Builder final : public nlohmann::json_sax<ojson> {
 public:
  Builder(RequestBody& out, const char* ids_key) : out_(out), ids_key_(ids_key) {}

  bool null() override { return place(ojson(nullptr)); }
  bool boolean(bool v) override { return place(ojson(v)); }
  bool number_integer(number_integer_t v) override { return place(ojson(v)); }
  bool number_unsigned(number_unsigned_t v) override {
    if (!collecting_) return place(ojson(v));
    ids_.push_back(v);
    return true;
  }
  bool number_float(number_float_t v, const string_t&) override { return place(ojson(v)); }
  bool string(string_t& v) override { return place(ojson(std::move(v))); }
  bool binary(binary_t& v) override { return place(ojson::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(ojson::object()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    if (ids_key_ && stack_.size() == 1 && key_ == ids_key_) out_.ids.reset();  // a repeated key: the last one
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override {
    const bool ids = ids_key_ && stack_.size() == 1 && key_ == ids_key_;
    open(ojson::array());
    collecting_ = ids;
    return true;
  }
  bool end_array() override {
    if (collecting_) out_.ids = std::move(ids_), collecting_ = false;
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    error_ = e.what();
    return false;
  }
  const std::string& error() const { return error_; }

 private:
  // A value: the document itself, the next element of the open array, or the open object's key.
  ojson* put(ojson v) {
    if (collecting_) {  // not an id: the array's ids so far as JSON values, and no more collecting
      for (uint64_t id : ids_) stack_.back()->push_back(id);
      ids_.clear(), collecting_ = false;
    }
    if (stack_.empty()) return &(out_.json = std::move(v));
    ojson& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(top[key_] = std::move(v));
  }
  bool place(ojson v) {
    put(std::move(v));
    return true;
  }
  bool open(ojson v) {
    stack_.push_back(put(std::move(v)));  // its parent is not written again while it is open
    return true;
  }

  RequestBody& out_;
  const char* ids_key_;
  std::vector<ojson*> stack_;  // the open arrays and objects, innermost last
  std::string key_;
  bool collecting_ = false;
  std::vector<uint64_t> ids_;
  std::string error_;
};

}  // namespace

RequestBody read_body(std::string_view text, int max_depth, const char* ids_key) {
  if (nesting(text, max_depth) > max_depth)
    throw ApiError(400, "request body: expected JSON nested at most " + std::to_string(max_depth) +
                            " levels deep, found deeper nesting", {}, "invalid_json");
  RequestBody body;
  Builder builder(body, ids_key);
  if (!ojson::sax_parse(text, &builder)) {
    // A syntax error, or a number out of range (1e400); nlohmann's text starts with
    // "[json.exception.parse_error.101] ", the rest says where.
    std::string what = builder.error();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    throw ApiError(400, "request body: expected a JSON object, found invalid JSON (" + what + ")", {}, "invalid_json");
  }
  return body;
}

}  // namespace dsv41
