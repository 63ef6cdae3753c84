#include "engine/grammar/structured.h"
#include "model/sampling.h"
#include "server/openai_api.h"
#include "server/request_body.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <random>

namespace dsv41 {

using nlohmann::json;
// Requests are read with their keys in the order the client sent them: the chat format writes
// tool schemas and arguments in that order.
using ojson = nlohmann::ordered_json;

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code, std::string type)
    : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)),
      type_(std::move(type)) {}

json ApiError::body() const {
  auto or_null = [](const std::string& s) { return s.empty() ? json(nullptr) : json(s); };
  return {{"error", {{"message", what()}, {"type", type_}, {"param", or_null(param_)}, {"code", or_null(code_)}}}};
}

std::string json_text(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

int64_t code_points(std::string_view text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

namespace {

// Deeper documents are refused before they are built: the OpenAI bodies nest a handful of levels
// (tool schemas a few more), and an unbounded depth would let one request exhaust the stack of
// whatever walks the tree recursively afterwards.
constexpr int kMaxDepth = 128;
constexpr int kMaxStop = 4;
// OpenAI's default for /v1/completions (chat has none: it runs to a stop or the context's end).
constexpr int32_t kCompletionsDefaultMaxTokens = 16;

// What a JSON value is, for "found ...": the type, and the value when it is short.
std::string describe(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::null: return "null";
    case ojson::value_t::boolean: return v.get<bool>() ? "boolean true" : "boolean false";
    case ojson::value_t::number_integer:
    case ojson::value_t::number_unsigned: return "integer " + v.dump();
    case ojson::value_t::number_float: return "number " + v.dump();
    case ojson::value_t::string: {
      std::string s = v.get<std::string>();
      constexpr size_t kShown = 40;
      if (s.size() > kShown) return "string " + json_text(s.substr(0, kShown)) + "... (" + std::to_string(s.size()) + " bytes)";
      return "string " + json_text(s);
    }
    case ojson::value_t::array: return "an array of " + std::to_string(v.size()) + " element" + (v.size() == 1 ? "" : "s");
    case ojson::value_t::object: return "an object";
    default: return "a binary value";
  }
}

[[noreturn]] void bad_type(const std::string& param, const std::string& expected, const ojson& found) {
  throw ApiError(400, param + ": expected " + expected + ", found " + describe(found), param, "invalid_type");
}
[[noreturn]] void bad_value(const std::string& param, const std::string& expected, const ojson& found) {
  throw ApiError(400, param + ": expected " + expected + ", found " + describe(found), param, "invalid_value");
}
[[noreturn]] void unsupported(const std::string& param, const std::string& expected, const ojson& found) {
  throw ApiError(400, param + ": expected " + expected + ", found " + describe(found), param, "unsupported_value");
}

// The body as a JSON object (request_body.h), and the top-level array of token ids under ids_key
// read apart into `ids` when it holds only integers >= 0.
ojson parse_body(std::string_view text, const char* ids_key = nullptr, std::optional<std::vector<uint64_t>>* ids = nullptr) {
  RequestBody body = read_body(text, kMaxDepth, ids_key);
  if (!body.json.is_object())
    throw ApiError(400, "request body: expected a JSON object, found " + describe(body.json), {}, "invalid_json");
  if (ids) *ids = std::move(body.ids);
  return std::move(body.json);
}

// A field that is absent or null reads as absent: OpenAI treats an explicit null as the default.
const ojson* field(const ojson& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::string range_text(double lo, double hi, bool lo_open) {
  auto num = [](double x) { return ojson(x).dump(); };
  return (lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + "]";
}

// A number the engine runs in fp32, checked as the float it becomes: 1e-320 is in (0, 1] as a
// double but 0 as a float, which the sampler would refuse after the request had been accepted.
float float_in(const ojson& v, const std::string& param, float lo, float hi, bool lo_open = false) {
  const std::string expected = "a number in " + range_text(lo, hi, lo_open) + " (as a 32-bit float)";
  if (!v.is_number()) bad_type(param, expected, v);
  const float x = float(v.get<double>());
  if (!(x >= lo && x <= hi) || (lo_open && x == lo)) bad_value(param, expected, v);
  return x;
}

// Integers only: 2.0 is a number, not an integer, as in OpenAI's schema.
int64_t integer_in(const ojson& v, const std::string& param, int64_t lo, int64_t hi, const std::string& expected) {
  if (!v.is_number_integer()) bad_type(param, expected, v);
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    bad_value(param, expected, v);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad_value(param, expected, v);
  return x;
}

bool boolean(const ojson& v, const std::string& param) {
  if (!v.is_boolean()) bad_type(param, "a boolean", v);
  return v.get<bool>();
}

// An array of token ids in [0, vocab), its elements named param[i] in errors: as JSON values, or
// read apart as integers >= 0 (parse_body). The common case is checked first, without building
// the element's name: a 32K-token prompt has 32K of them.
std::vector<int32_t> token_ids(const std::vector<uint64_t>& values, const std::string& param, int64_t vocab) {
  std::vector<int32_t> ids(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] >= uint64_t(vocab))
      bad_value(param + "[" + std::to_string(i) + "]", "a token id in [0, " + std::to_string(vocab) + ")", ojson(values[i]));
    ids[i] = int32_t(values[i]);
  }
  return ids;
}
std::vector<int32_t> token_ids(const ojson& array, const std::string& param, int64_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (size_t i = 0; i < array.size(); ++i) {
    const ojson& id = array[i];
    if (id.is_number_unsigned() && id.get<uint64_t>() < uint64_t(vocab)) {
      ids.push_back(int32_t(id.get<uint64_t>()));
      continue;
    }
    const std::string expected = "a token id in [0, " + std::to_string(vocab) + ")";
    ids.push_back(int32_t(integer_in(id, param + "[" + std::to_string(i) + "]", 0, vocab - 1, expected)));
  }
  return ids;
}

void parse_model(const ojson& body, const ApiConfig& config, GenerationParams& gen) {
  const ojson* v = field(body, "model");
  std::string known;
  for (const std::string& m : config.models) known += (known.empty() ? "" : ", ") + json_text(m);
  const std::string expected = "one of " + known;
  if (!v) throw ApiError(400, "model: expected " + expected + ", found nothing (the field is required)", "model",
                         "missing_required_parameter");
  if (!v->is_string()) bad_type("model", "a string, " + expected, *v);
  gen.model = v->get<std::string>();
  for (const std::string& m : config.models)
    if (m == gen.model) return;
  throw ApiError(404, "model: expected " + expected + ", found " + describe(*v), "model", "model_not_found");
}

void parse_stream(const ojson& body, GenerationParams& gen) {
  if (const ojson* v = field(body, "stream")) gen.stream = boolean(*v, "stream");
  if (const ojson* v = field(body, "stream_options")) {
    if (!v->is_object()) bad_type("stream_options", "an object", *v);
    if (!gen.stream)
      throw ApiError(400, "stream_options: expected only together with \"stream\": true, found it with stream off",
                     "stream_options", "invalid_value");
    if (const ojson* u = field(*v, "include_usage")) gen.include_usage = boolean(*u, "stream_options.include_usage");
    // vLLM's usage in every chunk: not sent, so not accepted.
    if (const ojson* c = field(*v, "continuous_usage_stats"); c && !(c->is_boolean() && !c->get<bool>()))
      unsupported("stream_options.continuous_usage_stats", "false (the usage comes once, after the finish: include_usage)", *c);
  }
}

std::vector<std::string> parse_stop(const ojson& v) {
  const std::string expected = "a non-empty string or an array of at most 4 non-empty strings";
  std::vector<std::string> stop;
  if (v.is_string()) {
    if (v.get<std::string>().empty()) bad_value("stop", expected, v);
    stop.push_back(v.get<std::string>());
    return stop;
  }
  if (!v.is_array()) bad_type("stop", expected, v);
  if (v.size() > kMaxStop) bad_value("stop", expected, v);
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string param = "stop[" + std::to_string(i) + "]";
    if (!v[i].is_string()) bad_type(param, "a non-empty string", v[i]);
    if (v[i].get<std::string>().empty()) bad_value(param, "a non-empty string", v[i]);
    stop.push_back(v[i].get<std::string>());
  }
  return stop;
}

// logit_bias: {"token id": bias}, as OpenAI's (ids as decimal strings, biases in [-100, 100]).
std::vector<std::pair<int, float>> parse_logit_bias(const ojson& v, int64_t vocab) {
  if (!v.is_object()) bad_type("logit_bias", "an object of token ids to numbers in [-100, 100]", v);
  std::map<int, float> bias;
  for (const auto& [key, value] : v.items()) {
    const std::string param = "logit_bias." + key;
    const std::string expected = "a token id in [0, " + std::to_string(vocab) + ") as a decimal string";
    int64_t id = -1;  // decimal digits only: from_chars takes no space or '+', and '-' gives id < 0
    const auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (error != std::errc{} || end != key.data() + key.size() || id < 0 || id >= vocab)
      throw ApiError(400, "logit_bias: expected keys " + expected + ", found \"" + key + "\"", "logit_bias", "invalid_value");
    bias[int(id)] = float_in(value, param, -100, 100);
  }
  return {bias.begin(), bias.end()};
}

void parse_sampling(const ojson& body, RequestSampling& s, const ApiConfig& config) {
  if (const ojson* v = field(body, "temperature")) s.temperature = float_in(*v, "temperature", 0, 2);
  if (const ojson* v = field(body, "top_p")) s.top_p = float_in(*v, "top_p", 0, 1, /*lo_open=*/true);
  if (const ojson* v = field(body, "top_k")) {
    const int64_t k = integer_in(*v, "top_k", -1, std::numeric_limits<int32_t>::max(),
                                 "an integer >= 0, or -1 (0 and -1 both turn top-k off)");
    s.top_k = k < 0 ? 0 : static_cast<int32_t>(k);
  }
  if (const ojson* v = field(body, "min_p")) s.min_p = float_in(*v, "min_p", 0, 1);
  if (const ojson* v = field(body, "seed"))
    s.seed = integer_in(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                        "a 64-bit signed integer");
  if (const ojson* v = field(body, "stop")) s.stop = parse_stop(*v);
  if (const ojson* v = field(body, "ignore_eos")) {
    if (!v->is_boolean()) bad_type("ignore_eos", "true or false", *v);
    s.ignore_eos = v->get<bool>();
  }
  if (const ojson* v = field(body, "presence_penalty")) s.presence_penalty = float_in(*v, "presence_penalty", -2, 2);
  if (const ojson* v = field(body, "frequency_penalty")) s.frequency_penalty = float_in(*v, "frequency_penalty", -2, 2);
  if (const ojson* v = field(body, "repetition_penalty"))
    s.repetition_penalty = float_in(*v, "repetition_penalty", 0, 10, /*lo_open=*/true);
  if (const ojson* v = field(body, "logit_bias")) s.logit_bias = parse_logit_bias(*v, config.vocab_size);
  if (const ojson* v = field(body, "speculative")) {
    if (!v->is_boolean()) bad_type("speculative", "true or false", *v);
    s.speculative = v->get<bool>();
  }
  // max_completion_tokens is the newer name; when both are sent it wins, as in OpenAI's API.
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (const ojson* v = field(body, key))
      s.max_tokens = static_cast<int32_t>(
          integer_in(*v, key, 1, std::numeric_limits<int32_t>::max(), "a positive integer"));
}

// n: the choices, at most as many as one batch runs (they fork from the prompt and run together).
void parse_n(const ojson& body, const ApiConfig& config, GenerationParams& gen) {
  const ojson* v = field(body, "n");
  if (!v) return;
  const std::string expected = "an integer in [1, " + std::to_string(config.max_choices) +
                               "] (a request's choices run in one batch: serve --max-running)";
  if (!v->is_number_integer()) bad_type("n", expected, *v);
  // (JSON's positive integers read as unsigned; 0 too, and the negative ones as signed.)
  if (!v->is_number_unsigned() || v->get<uint64_t>() < 1) bad_value("n", expected, *v);
  if (v->get<uint64_t>() > uint64_t(config.max_choices)) unsupported("n", expected, *v);  // OpenAI's, beyond this server's batch
  gen.n = int(v->get<uint64_t>());
}

// response_format: text (nothing to do), json_object, or json_schema {"name", "schema",
// "strict"} whose schema must be in the subset (its automaton is built here to find out).
void parse_response_format(const ojson& v, ChatRequest& req) {
  if (!v.is_object()) bad_type("response_format", "an object", v);
  const ojson* type = field(v, "type");
  if (!type || !type->is_string()) bad_type("response_format.type", "a string", type ? *type : ojson());
  if (*type == "text") return;
  if (*type == "json_object") {
    req.response_format = v;
    return;
  }
  if (*type != "json_schema") bad_value("response_format.type", "\"text\", \"json_object\" or \"json_schema\"", *type);
  const ojson* spec = field(v, "json_schema");
  if (!spec || !spec->is_object()) bad_type("response_format.json_schema", "an object with a schema", spec ? *spec : ojson());
  if (const ojson* strict = field(*spec, "strict")) boolean(*strict, "response_format.json_schema.strict");
  const ojson* schema = field(*spec, "schema");
  if (!schema || !(schema->is_object() || schema->is_boolean()))
    bad_type("response_format.json_schema.schema", "a JSON Schema (an object)", schema ? *schema : ojson());
  try {
    grammar::Nfa nfa;
    grammar::json_schema_automaton(nfa, *schema);
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, "response_format.json_schema.schema: the keyword \"" + e.keyword + "\" at " + e.what() +
                            " (the supported subset is in docs/openai-api.md)", "response_format", "unsupported_value");
  } catch (const Error& e) {
    throw ApiError(400, std::string("response_format.json_schema.schema: ") + e.what(), "response_format", "invalid_value");
  }
  req.response_format = v;
}

// The functions a tool call may name under the request's tool_choice ("required": any tool;
// a function: that one), each a tool's "function" object; empty when no call is required.
std::vector<ojson> required_functions(const ChatRequest& req) {
  std::vector<ojson> all;
  if (req.tools.is_array())
    for (const ojson& t : req.tools)
      if (t.is_object() && t.contains("function") && t["function"].is_object()) all.push_back(t["function"]);
  if (req.tool_choice.is_string()) return req.tool_choice == "required" ? all : std::vector<ojson>{};
  if (!req.tool_choice.is_object()) return {};
  const std::string name = req.tool_choice["function"]["name"].get<std::string>();
  for (const ojson& f : all)
    if (f.contains("name") && f["name"] == name) return {f};
  return {};
}

// tool_choice: "none", "auto", "required" (with tools), or {"type": "function", "function":
// {"name"}} naming one of them; the functions a call may name must have parameters in the subset.
void check_tool_choice(const ChatRequest& req) {
  const ojson& c = req.tool_choice;
  if (c.is_null()) return;
  const bool tools = req.tools.is_array() && !req.tools.empty();
  if (c.is_string()) {
    if (c != "none" && c != "auto" && c != "required") bad_value("tool_choice", "\"none\", \"auto\", \"required\" or a function", c);
    if (c == "required" && !tools) bad_value("tool_choice", "\"required\" only with tools", c);
  } else {
    const ojson* type = field(c, "type");
    const ojson* fn = field(c, "function");
    const ojson* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!type || *type != "function" || !name || !name->is_string())
      bad_value("tool_choice", "{\"type\": \"function\", \"function\": {\"name\": ...}}", c);
    if (required_functions(req).empty()) bad_value("tool_choice.function.name", "the name of one of the request's tools", *name);
  }
  std::vector<ojson> functions = required_functions(req);
  for (size_t i = 0; i < functions.size(); ++i) {
    const ojson* name = field(functions[i], "name");
    if (!name || !name->is_string() || name->get<std::string>().empty())
      bad_type("tools[" + std::to_string(i) + "].function.name", "a non-empty string", name ? *name : ojson());
  }
  try {
    grammar::Nfa nfa;
    if (!functions.empty()) grammar::tool_calls_automaton(nfa, functions, req.parallel_tool_calls);
  } catch (const grammar::SchemaError& e) {
    throw ApiError(400, "tools: the keyword \"" + e.keyword + "\" at " + e.what() + " (the supported subset is in docs/openai-api.md)",
                   "tools", "unsupported_value");
  } catch (const std::exception& e) {  // Error, or a parameters object of the wrong shape
    throw ApiError(400, std::string("tools: function parameters outside the supported JSON Schema subset: ") + e.what(), "tools",
                   "invalid_value");
  }
}

void parse_common(const ojson& body, const ApiConfig& config, GenerationParams& gen) {
  parse_model(body, config, gen);
  parse_stream(body, gen);
  parse_sampling(body, gen.sampling, config);
  parse_n(body, config, gen);
}

// Fields of OpenAI's and vLLM's APIs that dsv41 does not implement and whose being ignored would
// change the result: refused unless absent, null or at the value that asks for nothing, each
// naming what to send instead (docs/openai-api.md, "Fields not implemented"). Fields no API names
// are ignored, as their absence would be.
void refuse_unimplemented(const ojson& body, bool chat) {
  using Default = bool (*)(const ojson&);
  const Default none = [](const ojson&) { return false; };  // any value asks for something
  const Default is_false = [](const ojson& v) { return v.is_boolean() && !v.get<bool>(); };
  const Default is_zero = [](const ojson& v) { return v.is_number_integer() && v.get<int64_t>() == 0; };
  const Default is_empty = [](const ojson& v) { return v.is_array() && v.empty(); };
  const Default text_only = [](const ojson& v) { return v == ojson::array({"text"}); };
  const Default is_true = [](const ojson& v) { return v.is_boolean() && v.get<bool>(); };
  struct Unimplemented {
    const char* field;
    const char* expected;
    bool chat_only;
    Default is_default;
  };
  const Unimplemented fields[] = {
      {"functions", "none (the legacy form of tools: send \"tools\")", true, none},
      {"function_call", "none (the legacy form of tool_choice: send \"tool_choice\")", true, none},
      {"modalities", "[\"text\"] (dsv41 answers in text)", true, text_only},
      {"audio", "none (dsv41 answers in text)", true, none},
      {"chat_template", "none (dsv41 renders V4.1's own chat format: docs/chat-format.md)", true, none},
      {"add_generation_prompt", "true (the reply always follows the messages as a new assistant turn)", true, is_true},
      {"continue_final_message", "false (the reply is a new assistant turn)", true, is_false},
      {"echo", "false in chat (completions echo their prompt)", true, is_false},
      {"min_tokens", "0 (no minimum length: \"ignore_eos\" with max_tokens gives a fixed one)", false, is_zero},
      {"stop_token_ids", "[] (stop strings only: \"stop\")", false, is_empty},
      {"include_stop_str_in_output", "false (the reply ends before its stop string)", false, is_false},
      {"use_beam_search", "false (dsv41 samples)", false, is_false},
      {"bad_words", "[] (\"logit_bias\" of -100 bans a token)", false, is_empty},
      {"allowed_token_ids", "none (\"logit_bias\", or structured output: \"response_format\")", false, none},
      {"logits_processors", "none", false, none},
      {"truncate_prompt_tokens", "none (a prompt beyond the context is refused, not cut)", false, none},
      {"skip_special_tokens", "false (the text keeps a special token's text; the chat markup is parsed apart)", false, is_false},
      {"return_tokens_as_token_ids", "false (logprobs name tokens by their text and bytes)", false, is_false},
      {"prompt_logprobs", "none (completions' \"echo\" with \"logprobs\" scores the prompt)", false, none},
      {"guided_json", "none (structured output: \"response_format\")", false, none},
      {"guided_regex", "none (structured output: \"response_format\" with a pattern)", false, none},
      {"guided_choice", "none (structured output: \"response_format\" with an enum)", false, none},
      {"guided_grammar", "none (structured output: \"response_format\")", false, none},
      {"structured_outputs", "none (structured output: \"response_format\")", false, none},
  };
  for (const Unimplemented& f : fields) {
    if (f.chat_only && !chat) continue;
    if (const ojson* v = field(body, f.field); v && !f.is_default(*v)) unsupported(f.field, f.expected, *v);
  }
}

}  // namespace

std::shared_ptr<grammar::Grammar> output_grammar(const ChatRequest& req, grammar::GrammarCache& cache) {
  const std::vector<ojson> functions = required_functions(req);
  if (!functions.empty()) return cache.tool_calls(functions, req.parallel_tool_calls);
  const bool tools = req.tools.is_array() && !req.tools.empty();
  if (req.response_format.is_object()) {
    if (req.response_format["type"] == "json_object") return cache.json_object();
    return cache.json_schema(req.response_format["json_schema"]["schema"]);
  }
  if (tools && req.tool_choice == "none") return cache.no_tool_calls();
  return nullptr;
}

ChatRequest parse_chat_request(std::string_view text, const ApiConfig& config) {
  const ojson body = parse_body(text);
  ChatRequest req;
  parse_common(body, config, req.gen);
  refuse_unimplemented(body, /*chat=*/true);

  const ojson* messages = field(body, "messages");
  const std::string expected = "a non-empty array of message objects";
  if (!messages)
    throw ApiError(400, "messages: expected " + expected + ", found nothing (the field is required)", "messages",
                   "missing_required_parameter");
  if (!messages->is_array()) bad_type("messages", expected, *messages);
  if (messages->empty()) bad_value("messages", expected, *messages);
  for (size_t i = 0; i < messages->size(); ++i) {
    const ojson& m = (*messages)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_type(param, "an object", m);
    auto role = m.find("role");
    if (role == m.end())
      throw ApiError(400, param + ".role: expected a string, found nothing (the field is required)", param + ".role",
                     "missing_required_parameter");
    if (!role->is_string()) bad_type(param + ".role", "a string", *role);
  }
  req.messages = *messages;

  if (const ojson* v = field(body, "tools")) {
    if (!v->is_array()) bad_type("tools", "an array", *v);
    req.tools = *v;
  }
  if (const ojson* v = field(body, "tool_choice")) {
    if (!v->is_string() && !v->is_object()) bad_type("tool_choice", "a string or an object", *v);
    req.tool_choice = *v;
  }
  if (const ojson* v = field(body, "reasoning_effort")) req.reasoning_effort = *v;
  if (const ojson* v = field(body, "chat_template_kwargs")) {
    if (!v->is_object()) bad_type("chat_template_kwargs", "an object", *v);
    req.chat_template_kwargs = *v;
  }
  if (const ojson* v = field(body, "parallel_tool_calls")) req.parallel_tool_calls = boolean(*v, "parallel_tool_calls");
  if (const ojson* v = field(body, "response_format")) parse_response_format(*v, req);
  check_tool_choice(req);
  // A stop string could cut the structured answer, and without the end token it could not end.
  if (!req.response_format.is_null() || !required_functions(req).empty()) {
    if (!req.gen.sampling.stop.empty())
      unsupported("stop", "none with response_format or a required tool call (a stop string could cut the answer)", ojson(req.gen.sampling.stop));
    if (req.gen.sampling.ignore_eos)
      unsupported("ignore_eos", "false with response_format or a required tool call (the end token ends the answer)", ojson(true));
  }
  if (!config.structured_output) {
    if (!req.response_format.is_null())
      unsupported("response_format", "{\"type\": \"text\"} (this server does not enforce structured output)", req.response_format);
    if (!required_functions(req).empty())
      unsupported("tool_choice", "\"none\" or \"auto\" (this server does not enforce tool calls)", req.tool_choice);
  }

  const ojson* logprobs = field(body, "logprobs");
  if (logprobs) req.gen.logprobs.enabled = boolean(*logprobs, "logprobs");
  if (const ojson* v = field(body, "top_logprobs")) {
    const std::string expected_top = "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]";
    req.gen.logprobs.top = static_cast<int32_t>(integer_in(*v, "top_logprobs", 0, kMaxTopLogprobs, expected_top));
    if (!req.gen.logprobs.enabled)
      throw ApiError(400, "top_logprobs: expected only together with \"logprobs\": true, found it with logprobs " +
                              std::string(logprobs ? "false" : "absent"),
                     "top_logprobs", "invalid_value");
  }
  return req;
}

TokenizeRequest parse_tokenize_request(std::string_view text, const ApiConfig& config) {
  const ojson body = parse_body(text);
  TokenizeRequest req;
  if (field(body, "messages")) {
    req.chat = parse_chat_request(text, config);
    return req;
  }
  GenerationParams gen;
  parse_model(body, config, gen);
  const ojson* prompt = field(body, "prompt");
  if (!prompt)
    throw ApiError(400, "prompt: expected a string (or \"messages\": a chat), found nothing", "prompt",
                   "missing_required_parameter");
  if (!prompt->is_string()) bad_type("prompt", "a string", *prompt);
  req.prompt = prompt->get<std::string>();
  if (const ojson* v = field(body, "add_special_tokens")) req.add_special_tokens = boolean(*v, "add_special_tokens");
  return req;
}

json tokenize_json(std::span<const int> tokens, int64_t max_model_len) {
  return {{"count", tokens.size()}, {"max_model_len", max_model_len}, {"tokens", std::vector<int>(tokens.begin(), tokens.end())}};
}

std::vector<int32_t> parse_detokenize_request(std::string_view text, const ApiConfig& config) {
  std::optional<std::vector<uint64_t>> ids;
  const ojson body = parse_body(text, "tokens", &ids);
  GenerationParams gen;
  parse_model(body, config, gen);
  const ojson* tokens = field(body, "tokens");
  const std::string expected = "an array of token ids";
  if (!tokens) throw ApiError(400, "tokens: expected " + expected + ", found nothing (the field is required)", "tokens",
                              "missing_required_parameter");
  if (ids) return token_ids(*ids, "tokens", config.vocab_size);
  if (!tokens->is_array()) bad_type("tokens", expected, *tokens);
  return token_ids(*tokens, "tokens", config.vocab_size);
}

CompletionRequest parse_completion_request(std::string_view text, const ApiConfig& config) {
  std::optional<std::vector<uint64_t>> ids;
  const ojson body = parse_body(text, "prompt", &ids);
  CompletionRequest req;
  parse_common(body, config, req.gen);
  refuse_unimplemented(body, /*chat=*/false);
  if (!field(body, "max_tokens") && !field(body, "max_completion_tokens"))
    req.gen.sampling.max_tokens = kCompletionsDefaultMaxTokens;

  const ojson* prompt = field(body, "prompt");
  const std::string expected = "a string, or an array of token ids";
  if (!prompt)
    throw ApiError(400, "prompt: expected " + expected + ", found nothing (the field is required)", "prompt",
                   "missing_required_parameter");
  // OpenAI also takes a batch (an array of strings or of token arrays); dsv41 serves one prompt
  // per request, so a batch of one is unwrapped and larger ones are refused.
  const ojson* p = prompt;
  std::string param = "prompt";
  if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
    if (p->size() != 1) unsupported("prompt", "a single prompt (dsv41 serves one prompt per request)", *p);
    p = &(*p)[0];
    param = "prompt[0]";
  }
  if (ids) {  // an array of ids read apart (parse_body): p is empty in the document
    if (ids->empty()) bad_value(param, "a non-empty array of token ids", *p);
    req.prompt = token_ids(*ids, param, config.vocab_size);
  } else if (p->is_string()) {
    req.prompt = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) bad_value(param, "a non-empty array of token ids", *p);
    req.prompt = token_ids(*p, param, config.vocab_size);
  } else {
    bad_type(param, expected, *p);
  }

  if (const ojson* v = field(body, "logprobs")) {
    req.gen.logprobs.enabled = true;
    req.gen.logprobs.top = static_cast<int32_t>(integer_in(
        *v, "logprobs", 0, kMaxTopLogprobs, "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]"));
  }
  if (const ojson* v = field(body, "echo")) req.echo = boolean(*v, "echo");
  if (const ojson* v = field(body, "best_of")) {
    integer_in(*v, "best_of", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), "the integer 1");
    if (v->get<int64_t>() != 1) unsupported("best_of", "1 (dsv41 does not rank extra choices: ask for n choices instead)", *v);
  }
  if (const ojson* v = field(body, "suffix")) {
    if (!v->is_string()) bad_type("suffix", "a string", *v);
    if (!v->get<std::string>().empty()) unsupported("suffix", "an empty string (dsv41 does not insert text)", *v);
  }
  return req;
}

void check_context_length(int64_t prompt_tokens, std::optional<int32_t> max_tokens, int64_t context_length) {
  const int64_t wanted = prompt_tokens + (max_tokens ? *max_tokens : 1);
  if (wanted <= context_length) return;
  const std::string ctx = std::to_string(context_length);
  std::string message;
  if (max_tokens)
    message = "prompt + max_tokens: expected at most " + ctx + " tokens (the model's context length), found " +
              std::to_string(prompt_tokens) + " prompt tokens + " + std::to_string(*max_tokens) + " = " +
              std::to_string(wanted);
  else
    message = "prompt: expected fewer than " + ctx + " tokens (the model's context length, less one to generate), found " +
              std::to_string(prompt_tokens);
  throw ApiError(400, message, max_tokens ? "max_tokens" : "prompt", "context_length_exceeded");
}

// ---- responses --------------------------------------------------------------------------------

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::ToolCalls: return "tool_calls";
  }
  return "stop";
}

std::string new_response_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  id += '-';
  for (int word = 0; word < 2; ++word) {
    uint64_t bits = rng();
    for (int i = 0; i < 12; ++i, bits >>= 4) id += kHex[bits & 15];
  }
  return id;
}

ResponseMeta new_response_meta(std::string_view prefix, std::string model) {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return {new_response_id(prefix), std::chrono::duration_cast<std::chrono::seconds>(now).count(), std::move(model)};
}

namespace {

json usage_json(const Usage& u) {
  json details = {{"cached_tokens", u.cached_tokens}, {"replayed_tokens", u.replayed_tokens}};
  if (u.image_tokens > 0) details["image_tokens"] = u.image_tokens;
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", details}};
}

json header(const ResponseMeta& meta, const char* object) {
  return {{"id", meta.id}, {"object", object}, {"created", meta.created}, {"model", meta.model}};
}

// OpenAI sends -9999.0 for a probability of zero; JSON has no -inf.
double finite_logprob(double lp) { return std::isfinite(lp) ? lp : -9999.0; }

json token_bytes(const std::string& token) {
  json bytes = json::array();
  for (unsigned char c : token) bytes.push_back(static_cast<int>(c));
  return bytes;
}

json chat_logprobs_json(const std::vector<TokenLogprob>& tokens) {
  json content = json::array();
  for (const TokenLogprob& t : tokens) {
    json top = json::array();
    for (const TopLogprob& alt : t.top)
      top.push_back({{"token", alt.token}, {"logprob", finite_logprob(alt.logprob)}, {"bytes", token_bytes(alt.token)}});
    content.push_back({{"token", t.token},
                       {"logprob", finite_logprob(t.logprob)},
                       {"bytes", token_bytes(t.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs_json(const std::vector<TokenLogprob>& tokens, int64_t text_offset) {
  json toks = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprob& t : tokens) {
    toks.push_back(t.token);
    lps.push_back(t.unscored ? json(nullptr) : json(finite_logprob(t.logprob)));
    json top = json::object();
    for (const TopLogprob& alt : t.top) top[alt.token] = finite_logprob(alt.logprob);
    tops.push_back(t.unscored ? json(nullptr) : std::move(top));
    offsets.push_back(text_offset);
    text_offset += code_points(t.token);
  }
  return {{"tokens", std::move(toks)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json finish_json(const std::optional<FinishReason>& reason) {
  return reason ? json(to_string(*reason)) : json(nullptr);
}

}  // namespace

json chat_completion_json(const ResponseMeta& meta, std::span<const ChatChoice> choices, const Usage& usage) {
  json out = header(meta, "chat.completion");
  out["choices"] = json::array();
  for (const ChatChoice& choice : choices) {
    json message = {{"role", "assistant"}};
    message["content"] = choice.content.empty() && !choice.tool_calls.empty() ? json(nullptr) : json(choice.content);
    if (!choice.reasoning_content.empty()) message["reasoning_content"] = choice.reasoning_content;
    if (!choice.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& c : choice.tool_calls)
        calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      message["tool_calls"] = std::move(calls);
    }
    json c = {{"index", choice.index},
              {"message", std::move(message)},
              {"logprobs", choice.logprobs ? chat_logprobs_json(*choice.logprobs) : json(nullptr)},
              {"finish_reason", to_string(choice.finish_reason)}};
    if (choice.reasoning_only()) c["reasoning_only"] = true;
    out["choices"].push_back(std::move(c));
  }
  out["usage"] = usage_json(usage);
  return out;
}

json text_completion_json(const ResponseMeta& meta, std::span<const CompletionChoice> choices, const Usage& usage) {
  json out = header(meta, "text_completion");
  out["choices"] = json::array();
  for (const CompletionChoice& choice : choices)
    out["choices"].push_back({{"index", choice.index},
                              {"text", choice.text},
                              {"logprobs", choice.logprobs ? completion_logprobs_json(*choice.logprobs, 0) : json(nullptr)},
                              {"finish_reason", to_string(choice.finish_reason)}});
  out["usage"] = usage_json(usage);
  return out;
}

json chat_chunk_json(const ResponseMeta& meta, const ChatDelta& delta, bool include_usage) {
  json d = json::object();
  if (delta.role) d["role"] = "assistant";
  if (delta.content) d["content"] = *delta.content;
  if (delta.reasoning_content) d["reasoning_content"] = *delta.reasoning_content;
  if (!delta.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCallDelta& c : delta.tool_calls) {
      json call = {{"index", c.index}};
      json function = {{"arguments", c.arguments}};
      if (!c.id.empty()) {
        call["id"] = c.id;
        call["type"] = "function";
      }
      if (!c.name.empty()) function["name"] = c.name;
      call["function"] = std::move(function);
      calls.push_back(std::move(call));
    }
    d["tool_calls"] = std::move(calls);
  }
  json out = header(meta, "chat.completion.chunk");
  out["choices"] = json::array({{{"index", delta.index},
                                 {"delta", std::move(d)},
                                 {"logprobs", delta.logprobs ? chat_logprobs_json(*delta.logprobs) : json(nullptr)},
                                 {"finish_reason", finish_json(delta.finish_reason)}}});
  if (delta.reasoning_only) out["choices"][0]["reasoning_only"] = true;
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json completion_chunk_json(const ResponseMeta& meta, const CompletionDelta& delta, bool include_usage) {
  json out = header(meta, "text_completion");
  out["choices"] = json::array(
      {{{"index", delta.index},
        {"text", delta.text},
        {"logprobs", delta.logprobs ? completion_logprobs_json(*delta.logprobs, delta.text_offset) : json(nullptr)},
        {"finish_reason", finish_json(delta.finish_reason)}}});
  if (include_usage) out["usage"] = nullptr;
  return out;
}

json chat_usage_chunk_json(const ResponseMeta& meta, const Usage& usage) {
  json out = header(meta, "chat.completion.chunk");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

json completion_usage_chunk_json(const ResponseMeta& meta, const Usage& usage) {
  json out = header(meta, "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage_json(usage);
  return out;
}

std::string sse_event(const json& value) { return "data: " + json_text(value) + "\n\n"; }
std::string sse_done() { return "data: [DONE]\n\n"; }

json model_json(const ModelCard& m) { return {{"id", m.id}, {"object", "model"}, {"created", m.created}, {"owned_by", m.owned_by}}; }

json models_json(std::span<const ModelCard> models) {
  json data = json::array();
  for (const ModelCard& m : models) data.push_back(model_json(m));
  return {{"object", "list"}, {"data", std::move(data)}};
}

}  // namespace dsv41
