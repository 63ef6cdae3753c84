// The OpenAI request/response layer (src/server/openai_api): every validation rule of
// docs/openai-api.md, the error body, the response and chunk shapes OpenAI clients read, and the
// SSE framing. Expected JSON is written out by hand from OpenAI's API reference.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>

#include "server/openai_api.h"

namespace dsv41 {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

const ApiConfig kConfig{{"dsv41-tiny", "dsv41-alias"}, 1000, false, /*max_choices=*/8};

json chat_body(const json& extra = json::object()) {
  json b = {{"model", "dsv41-tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  b.update(extra);
  return b;
}
json completion_body(const json& extra = json::object()) {
  json b = {{"model", "dsv41-tiny"}, {"prompt", "Once upon"}};
  b.update(extra);
  return b;
}

ChatRequest chat(const json& extra = json::object()) { return parse_chat_request(chat_body(extra).dump(), kConfig); }
CompletionRequest completion(const json& extra = json::object()) {
  return parse_completion_request(completion_body(extra).dump(), kConfig);
}

// The ApiError a parse throws; a parse that succeeds fails the test.
template <typename Parse>
ApiError error_of(Parse parse, const std::string& text) {
  try {
    parse(text, kConfig);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << text;
  return ApiError(0, "");
}
ApiError chat_error(const json& extra) { return error_of(parse_chat_request, chat_body(extra).dump()); }
ApiError completion_error(const json& extra) {
  return error_of(parse_completion_request, completion_body(extra).dump());
}

// status, param, code, and the parts of the message that say what was expected and found.
void expect_error(const ApiError& e, int status, const std::string& param, const std::string& code,
                  const std::vector<std::string>& in_message) {
  EXPECT_EQ(e.status(), status) << e.what();
  EXPECT_EQ(e.param(), param) << e.what();
  EXPECT_EQ(e.code(), code) << e.what();
  EXPECT_EQ(e.type(), "invalid_request_error");
  for (const std::string& part : in_message)
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "\"" << part << "\" not in: " << e.what();
}

// ---- the request body -------------------------------------------------------------------------

TEST(OpenAiRequest, MinimalChatTakesTheDefaults) {
  const json body = chat_body();
  const ChatRequest r = parse_chat_request(body.dump(), kConfig);
  EXPECT_EQ(r.gen.model, "dsv41-tiny");
  EXPECT_EQ(r.messages, ojson(body["messages"]));
  EXPECT_FALSE(r.gen.stream);
  EXPECT_FALSE(r.gen.include_usage);
  EXPECT_EQ(r.gen.sampling.temperature, 1.0);
  EXPECT_EQ(r.gen.sampling.top_p, 1.0);
  EXPECT_EQ(r.gen.sampling.top_k, 0);
  EXPECT_EQ(r.gen.sampling.min_p, 0.0);
  EXPECT_FALSE(r.gen.sampling.seed);
  EXPECT_TRUE(r.gen.sampling.stop.empty());
  EXPECT_FALSE(r.gen.sampling.max_tokens);  // chat: until a stop or the context's end
  EXPECT_FALSE(r.gen.logprobs.enabled);
  EXPECT_EQ(r.gen.logprobs.top, 0);
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(r.tool_choice.is_null());
  EXPECT_TRUE(r.chat_template_kwargs.is_null());
  EXPECT_TRUE(r.reasoning_effort.is_null());
}

TEST(OpenAiRequest, ChatReadsEveryParameter) {
  const ChatRequest r = chat({{"model", "dsv41-alias"},
                              {"stream", true},
                              {"stream_options", {{"include_usage", true}}},
                              {"temperature", 0.7},
                              {"top_p", 0.9},
                              {"top_k", 40},
                              {"min_p", 0.05},
                              {"seed", -42},
                              {"stop", {"\n\n", "END"}},
                              {"max_tokens", 64},
                              {"ignore_eos", true},
                              {"speculative", false},
                              {"n", 1},
                              {"logprobs", true},
                              {"top_logprobs", 3},
                              {"presence_penalty", 0},
                              {"frequency_penalty", 0.0},
                              {"logit_bias", json::object()},
                              {"user", "someone"},
                              {"tools", json::array({{{"type", "function"}}})},
                              {"tool_choice", "auto"},
                              {"chat_template_kwargs", {{"thinking", true}}},
                              {"reasoning_effort", "max"},
                              {"response_format", {{"type", "text"}}}});
  EXPECT_EQ(r.gen.model, "dsv41-alias");
  EXPECT_TRUE(r.gen.stream);
  EXPECT_TRUE(r.gen.include_usage);
  EXPECT_EQ(r.gen.sampling.temperature, 0.7f);
  EXPECT_EQ(r.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(r.gen.sampling.top_k, 40);
  EXPECT_EQ(r.gen.sampling.min_p, 0.05f);
  EXPECT_EQ(r.gen.sampling.seed, -42);
  EXPECT_EQ(r.gen.sampling.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.gen.sampling.max_tokens, 64);
  EXPECT_TRUE(r.gen.sampling.ignore_eos);
  EXPECT_FALSE(r.gen.sampling.speculative);
  EXPECT_TRUE(r.gen.logprobs.enabled);
  EXPECT_EQ(r.gen.logprobs.top, 3);
  EXPECT_EQ(r.tools, ojson::array({{{"type", "function"}}}));
  EXPECT_EQ(r.tool_choice, "auto");
  EXPECT_EQ(r.chat_template_kwargs, ojson({{"thinking", true}}));
  EXPECT_EQ(r.reasoning_effort, "max");
}

TEST(OpenAiRequest, UnknownFieldsAndUserAreIgnored) {
  const ChatRequest r = chat({{"user", json::array()}, {"metadata", {{"a", 1}}}, {"no_such_field", "x"}});
  EXPECT_EQ(r.gen.model, "dsv41-tiny");
}

TEST(OpenAiRequest, NullMeansTheDefault) {
  const ChatRequest r = chat({{"temperature", nullptr}, {"stop", nullptr}, {"n", nullptr}, {"max_tokens", nullptr},
                              {"stream", nullptr}, {"logprobs", nullptr}, {"tools", nullptr}});
  EXPECT_EQ(r.gen.sampling.temperature, 1.0);
  EXPECT_TRUE(r.gen.sampling.stop.empty());
  EXPECT_FALSE(r.gen.sampling.max_tokens);
  EXPECT_FALSE(r.gen.stream);
  EXPECT_TRUE(r.tools.is_null());
}

TEST(OpenAiRequest, InvalidJsonIs400) {
  for (const char* text : {"{", "", "{\"model\": }", "{\"model\": \"dsv41-tiny\",}", "nul"}) {
    const ApiError e = error_of(parse_chat_request, text);
    expect_error(e, 400, "", "invalid_json", {"expected a JSON object", "found invalid JSON", "parse error"});
  }
  const ApiError e = error_of(parse_chat_request, "[1, 2]");
  expect_error(e, 400, "", "invalid_json", {"expected a JSON object, found an array of 2 elements"});
  // Ill-formed UTF-8 inside a string is invalid JSON, not a crash later.
  const ApiError utf8 = error_of(parse_chat_request, "{\"model\": \"\xff\"}");
  expect_error(utf8, 400, "", "invalid_json", {"found invalid JSON"});
  // A number no double holds, anywhere in the body: invalid JSON (400), not the parser's
  // internal error (it used to escape as a 500 with nlohmann's text).
  const ApiError big = error_of(parse_chat_request, "{\"model\": \"dsv41-tiny\", \"extra\": [1e400]}");
  expect_error(big, 400, "", "invalid_json", {"found invalid JSON", "1e400"});
}

TEST(OpenAiRequest, DeepNestingIsRefusedNotRecursedInto) {
  const int depth = 100000;
  const std::string text = "{\"messages\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  const ApiError e = error_of(parse_chat_request, text);
  expect_error(e, 400, "", "invalid_json", {"nested at most 128 levels"});
  // A body as deep as the limit allows is parsed.
  std::string ok = "{\"model\": \"dsv41-tiny\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"extra\": ";
  ok += std::string(120, '[') + std::string(120, ']') + "}";
  EXPECT_EQ(parse_chat_request(ok, kConfig).gen.model, "dsv41-tiny");
}

TEST(OpenAiRequest, Model) {
  json body = chat_body();
  body.erase("model");
  expect_error(error_of(parse_chat_request, body.dump()), 400, "model", "missing_required_parameter",
               {"expected one of \"dsv41-tiny\", \"dsv41-alias\"", "found nothing"});
  expect_error(chat_error({{"model", 7}}), 400, "model", "invalid_type", {"found integer 7"});
  expect_error(chat_error({{"model", "gpt-4o"}}), 404, "model", "model_not_found",
               {"expected one of \"dsv41-tiny\", \"dsv41-alias\"", "found string \"gpt-4o\""});
  expect_error(completion_error({{"model", "gpt-4o"}}), 404, "model", "model_not_found", {"gpt-4o"});
}

TEST(OpenAiRequest, Temperature) {
  EXPECT_EQ(chat({{"temperature", 0}}).gen.sampling.temperature, 0.0);
  EXPECT_EQ(chat({{"temperature", 2}}).gen.sampling.temperature, 2.0);
  expect_error(chat_error({{"temperature", 2.5}}), 400, "temperature", "invalid_value",
               {"expected a number in [0.0, 2.0]", "found number 2.5"});
  expect_error(chat_error({{"temperature", -0.1}}), 400, "temperature", "invalid_value", {"found number -0.1"});
  expect_error(chat_error({{"temperature", "hot"}}), 400, "temperature", "invalid_type", {"found string \"hot\""});
  expect_error(chat_error({{"temperature", true}}), 400, "temperature", "invalid_type", {"found boolean true"});
}

TEST(OpenAiRequest, TopP) {
  EXPECT_EQ(chat({{"top_p", 1}}).gen.sampling.top_p, 1.0);
  EXPECT_EQ(chat({{"top_p", 1e-9}}).gen.sampling.top_p, 1e-9f);
  // Checked as the fp32 the sampler runs in: 1e-320 is in (0, 1] as a double but 0 as a float
  // (it used to pass here and kill the scheduler thread when the sampler refused it).
  expect_error(chat_error({{"top_p", 1e-320}}), 400, "top_p", "invalid_value", {"as a 32-bit float", "found number"});
  expect_error(chat_error({{"temperature", 1e300}}), 400, "temperature", "invalid_value", {"found number"});
  expect_error(chat_error({{"top_p", 0}}), 400, "top_p", "invalid_value",
               {"expected a number in (0.0, 1.0]", "found integer 0"});
  expect_error(chat_error({{"top_p", 1.01}}), 400, "top_p", "invalid_value", {"found number 1.01"});
  expect_error(chat_error({{"top_p", "0.5"}}), 400, "top_p", "invalid_type", {"found string \"0.5\""});
}

TEST(OpenAiRequest, TopKMinusOneAndZeroAreOff) {
  EXPECT_EQ(chat({{"top_k", -1}}).gen.sampling.top_k, 0);
  EXPECT_EQ(chat({{"top_k", 0}}).gen.sampling.top_k, 0);
  EXPECT_EQ(chat({{"top_k", 1}}).gen.sampling.top_k, 1);
  EXPECT_EQ(chat({{"top_k", 2147483647}}).gen.sampling.top_k, 2147483647);
  expect_error(chat_error({{"top_k", -2}}), 400, "top_k", "invalid_value",
               {"expected an integer >= 0, or -1 (0 and -1 both turn top-k off)", "found integer -2"});
  expect_error(chat_error({{"top_k", 2147483648LL}}), 400, "top_k", "invalid_value", {"found integer 2147483648"});
  expect_error(chat_error({{"top_k", 4.5}}), 400, "top_k", "invalid_type", {"found number 4.5"});
  // An integer is an integer in the JSON text: 40.0 is a number, as in OpenAI's schema.
  expect_error(chat_error({{"top_k", 40.0}}), 400, "top_k", "invalid_type", {"found number 40.0"});
}

TEST(OpenAiRequest, MinP) {
  EXPECT_EQ(chat({{"min_p", 0}}).gen.sampling.min_p, 0.0);
  EXPECT_EQ(chat({{"min_p", 1}}).gen.sampling.min_p, 1.0);
  expect_error(chat_error({{"min_p", 1.5}}), 400, "min_p", "invalid_value",
               {"expected a number in [0.0, 1.0]", "found number 1.5"});
  expect_error(chat_error({{"min_p", -0.01}}), 400, "min_p", "invalid_value", {"found number -0.01"});
}

TEST(OpenAiRequest, Seed) {
  EXPECT_EQ(chat({{"seed", 0}}).gen.sampling.seed, 0);
  EXPECT_EQ(chat({{"seed", std::numeric_limits<int64_t>::min()}}).gen.sampling.seed,
            std::numeric_limits<int64_t>::min());
  EXPECT_EQ(chat({{"seed", std::numeric_limits<int64_t>::max()}}).gen.sampling.seed,
            std::numeric_limits<int64_t>::max());
  expect_error(chat_error({{"seed", std::numeric_limits<uint64_t>::max()}}), 400, "seed", "invalid_value",
               {"expected a 64-bit signed integer", "found integer 18446744073709551615"});
  expect_error(chat_error({{"seed", 1.5}}), 400, "seed", "invalid_type", {"found number 1.5"});
  expect_error(chat_error({{"seed", "7"}}), 400, "seed", "invalid_type", {"found string \"7\""});
}

TEST(OpenAiRequest, Stop) {
  EXPECT_EQ(chat({{"stop", "END"}}).gen.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(chat({{"stop", {"a", "b", "c", "d"}}}).gen.sampling.stop, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_TRUE(chat({{"stop", json::array()}}).gen.sampling.stop.empty());
  expect_error(chat_error({{"stop", {"a", "b", "c", "d", "e"}}}), 400, "stop", "invalid_value",
               {"an array of at most 4 non-empty strings", "found an array of 5 elements"});
  expect_error(chat_error({{"stop", ""}}), 400, "stop", "invalid_value", {"found string \"\""});
  expect_error(chat_error({{"stop", {"a", ""}}}), 400, "stop[1]", "invalid_value",
               {"expected a non-empty string", "found string \"\""});
  expect_error(chat_error({{"stop", {"a", 3}}}), 400, "stop[1]", "invalid_type", {"found integer 3"});
  expect_error(chat_error({{"stop", 3}}), 400, "stop", "invalid_type", {"found integer 3"});
}

TEST(OpenAiRequest, MaxTokensAndMaxCompletionTokens) {
  EXPECT_EQ(chat({{"max_tokens", 1}}).gen.sampling.max_tokens, 1);
  EXPECT_EQ(chat({{"max_completion_tokens", 9}}).gen.sampling.max_tokens, 9);
  // The newer name wins when both are sent.
  EXPECT_EQ(chat({{"max_tokens", 5}, {"max_completion_tokens", 9}}).gen.sampling.max_tokens, 9);
  EXPECT_EQ(completion({{"max_tokens", 5}, {"max_completion_tokens", 9}}).gen.sampling.max_tokens, 9);
  expect_error(chat_error({{"max_tokens", 0}}), 400, "max_tokens", "invalid_value",
               {"expected a positive integer", "found integer 0"});
  expect_error(chat_error({{"max_tokens", -5}}), 400, "max_tokens", "invalid_value", {"found integer -5"});
  expect_error(chat_error({{"max_tokens", "10"}}), 400, "max_tokens", "invalid_type", {"found string \"10\""});
  expect_error(chat_error({{"max_tokens", 10}, {"max_completion_tokens", 0}}), 400, "max_completion_tokens",
               "invalid_value", {"found integer 0"});
  expect_error(chat_error({{"max_tokens", 4294967296LL}}), 400, "max_tokens", "invalid_value",
               {"found integer 4294967296"});
}

TEST(OpenAiRequest, CompletionsDefaultTo16TokensAsOpenAiDoes) {
  EXPECT_EQ(completion().gen.sampling.max_tokens, 16);
  EXPECT_EQ(completion({{"max_tokens", nullptr}}).gen.sampling.max_tokens, 16);
  EXPECT_EQ(completion({{"max_tokens", 100}}).gen.sampling.max_tokens, 100);
}

// n: 1 by default, up to the server's batch (ApiConfig::max_choices); above it a valid OpenAI
// value this server does not serve, below 1 an invalid one.
TEST(OpenAiRequest, Choices) {
  EXPECT_EQ(chat().gen.n, 1);
  EXPECT_EQ(chat({{"n", nullptr}}).gen.n, 1);
  EXPECT_EQ(chat({{"n", 3}}).gen.n, 3);
  EXPECT_EQ(completion({{"n", 8}}).gen.n, 8);
  expect_error(chat_error({{"n", 9}}), 400, "n", "unsupported_value",
               {"expected an integer in [1, 8] (a request's choices run in one batch: serve --max-running)", "found integer 9"});
  expect_error(completion_error({{"n", 0}}), 400, "n", "invalid_value", {"found integer 0"});
  expect_error(completion_error({{"n", -2}}), 400, "n", "invalid_value", {"found integer -2"});
  expect_error(chat_error({{"n", "2"}}), 400, "n", "invalid_type", {"found string \"2\""});
  expect_error(chat_error({{"n", 2.0}}), 400, "n", "invalid_type", {"found number 2.0"});
  expect_error(chat_error({{"n", 18446744073709551615ull}}), 400, "n", "unsupported_value", {"found integer 18446744073709551615"});
  expect_error(completion_error({{"best_of", 3}}), 400, "best_of", "unsupported_value", {"found integer 3"});
  EXPECT_EQ(completion({{"best_of", 1}}).gen.model, "dsv41-tiny");
}

TEST(OpenAiRequest, Penalties) {
  const RequestSampling s =
      chat({{"presence_penalty", 0.5}, {"frequency_penalty", -1}, {"repetition_penalty", 1.25}}).gen.sampling;
  EXPECT_EQ(s.presence_penalty, 0.5f);
  EXPECT_EQ(s.frequency_penalty, -1.0f);
  EXPECT_EQ(s.repetition_penalty, 1.25f);
  const RequestSampling none = completion(json::object()).gen.sampling;
  EXPECT_EQ(none.presence_penalty, 0.0f);
  EXPECT_EQ(none.frequency_penalty, 0.0f);
  EXPECT_EQ(none.repetition_penalty, 1.0f);
  expect_error(chat_error({{"presence_penalty", 2.5}}), 400, "presence_penalty", "invalid_value",
               {"expected a number in [-2.0, 2.0]", "found number 2.5"});
  expect_error(completion_error({{"frequency_penalty", -3}}), 400, "frequency_penalty", "invalid_value", {"found integer -3"});
  expect_error(chat_error({{"frequency_penalty", "0"}}), 400, "frequency_penalty", "invalid_type", {"found string \"0\""});
  expect_error(chat_error({{"repetition_penalty", 0}}), 400, "repetition_penalty", "invalid_value", {"expected a number in (0.0, 10.0]"});
}

TEST(OpenAiRequest, LogitBias) {
  const RequestSampling s = chat({{"logit_bias", {{"999", -100}, {"7", 2.5}, {"0", 100}}}}).gen.sampling;
  const std::vector<std::pair<int, float>> want = {{0, 100.0f}, {7, 2.5f}, {999, -100.0f}};  // ascending ids
  EXPECT_EQ(s.logit_bias, want);
  EXPECT_TRUE(chat({{"logit_bias", json::object()}}).gen.sampling.logit_bias.empty());
  expect_error(chat_error({{"logit_bias", {{"1000", 1}}}}), 400, "logit_bias", "invalid_value",
               {"expected keys a token id in [0, 1000)", "found \"1000\""});
  for (const char* key : {"-1", "x", "1.5", " 1", ""})
    expect_error(chat_error({{"logit_bias", {{key, 1}}}}), 400, "logit_bias", "invalid_value", {"expected keys"});
  expect_error(chat_error({{"logit_bias", {{"5", 101}}}}), 400, "logit_bias.5", "invalid_value", {"expected a number in [-100.0, 100.0]"});
  expect_error(chat_error({{"logit_bias", {{"5", "1"}}}}), 400, "logit_bias.5", "invalid_type", {"found string"});
  expect_error(chat_error({{"logit_bias", json::array()}}), 400, "logit_bias", "invalid_type", {"found an array of 0 elements"});
}

TEST(OpenAiRequest, Stream) {
  EXPECT_TRUE(chat({{"stream", true}}).gen.stream);
  EXPECT_FALSE(chat({{"stream", true}, {"stream_options", json::object()}}).gen.include_usage);
  EXPECT_FALSE(chat({{"stream", true}, {"stream_options", {{"include_usage", false}}}}).gen.include_usage);
  EXPECT_TRUE(completion({{"stream", true}, {"stream_options", {{"include_usage", true}}}}).gen.include_usage);
  expect_error(chat_error({{"stream", "yes"}}), 400, "stream", "invalid_type",
               {"expected a boolean", "found string \"yes\""});
  expect_error(chat_error({{"stream_options", {{"include_usage", true}}}}), 400, "stream_options", "invalid_value",
               {"expected only together with \"stream\": true", "with stream off"});
  expect_error(chat_error({{"stream", true}, {"stream_options", {{"include_usage", 1}}}}), 400,
               "stream_options.include_usage", "invalid_type", {"found integer 1"});
  expect_error(chat_error({{"stream", true}, {"stream_options", true}}), 400, "stream_options", "invalid_type",
               {"expected an object", "found boolean true"});
}

TEST(OpenAiRequest, ChatLogprobs) {
  const ChatRequest only = chat({{"logprobs", true}});
  EXPECT_TRUE(only.gen.logprobs.enabled);
  EXPECT_EQ(only.gen.logprobs.top, 0);
  EXPECT_EQ(chat({{"logprobs", true}, {"top_logprobs", 20}}).gen.logprobs.top, 20);
  EXPECT_FALSE(chat({{"logprobs", false}}).gen.logprobs.enabled);
  expect_error(chat_error({{"logprobs", true}, {"top_logprobs", 21}}), 400, "top_logprobs", "invalid_value",
               {"expected an integer in [0, 20]", "found integer 21"});
  expect_error(chat_error({{"logprobs", true}, {"top_logprobs", -1}}), 400, "top_logprobs", "invalid_value",
               {"found integer -1"});
  expect_error(chat_error({{"top_logprobs", 2}}), 400, "top_logprobs", "invalid_value",
               {"expected only together with \"logprobs\": true", "with logprobs absent"});
  expect_error(chat_error({{"logprobs", false}, {"top_logprobs", 2}}), 400, "top_logprobs", "invalid_value",
               {"with logprobs false"});
  // Chat's logprobs is a boolean (the count is top_logprobs), unlike the completions endpoint's.
  expect_error(chat_error({{"logprobs", 5}}), 400, "logprobs", "invalid_type",
               {"expected a boolean", "found integer 5"});
}

TEST(OpenAiRequest, CompletionLogprobs) {
  EXPECT_FALSE(completion().gen.logprobs.enabled);
  EXPECT_FALSE(completion({{"logprobs", nullptr}}).gen.logprobs.enabled);
  const CompletionRequest zero = completion({{"logprobs", 0}});
  EXPECT_TRUE(zero.gen.logprobs.enabled);
  EXPECT_EQ(zero.gen.logprobs.top, 0);
  EXPECT_EQ(completion({{"logprobs", 20}}).gen.logprobs.top, 20);
  expect_error(completion_error({{"logprobs", 21}}), 400, "logprobs", "invalid_value",
               {"expected an integer in [0, 20]", "found integer 21"});
  expect_error(completion_error({{"logprobs", true}}), 400, "logprobs", "invalid_type", {"found boolean true"});
}

TEST(OpenAiRequest, Messages) {
  json body = chat_body();
  body.erase("messages");
  expect_error(error_of(parse_chat_request, body.dump()), 400, "messages", "missing_required_parameter",
               {"expected a non-empty array of message objects", "found nothing"});
  expect_error(chat_error({{"messages", json::array()}}), 400, "messages", "invalid_value",
               {"found an array of 0 elements"});
  expect_error(chat_error({{"messages", "hi"}}), 400, "messages", "invalid_type", {"found string \"hi\""});
  expect_error(chat_error({{"messages", {{{"role", "user"}}, 3}}}), 400, "messages[1]", "invalid_type",
               {"expected an object", "found integer 3"});
  expect_error(chat_error({{"messages", {{{"content", "x"}}}}}), 400, "messages[0].role", "missing_required_parameter",
               {"expected a string", "found nothing"});
  expect_error(chat_error({{"messages", {{{"role", 1}}}}}), 400, "messages[0].role", "invalid_type",
               {"found integer 1"});
  // Content and roles are the chat format's to judge; the messages reach it as sent.
  const json messages = {{{"role", "system"}, {"content", "be brief"}},
                         {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}},
                         {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array()}}};
  EXPECT_EQ(chat({{"messages", messages}}).messages, ojson(messages));
}

TEST(OpenAiRequest, KeysKeepTheClientsOrder) {
  // The chat format writes tool schemas and arguments in the order the client sent their keys.
  const std::string text = R"({"model": "dsv41-tiny",
      "messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f",
                    "arguments": {"zeta": 1, "alpha": 2}}}]}],
      "tools": [{"type": "function", "function": {"name": "f",
                 "parameters": {"properties": {"zeta": {}, "alpha": {}}}}}]})";
  const ChatRequest r = parse_chat_request(text, kConfig);
  EXPECT_EQ(r.messages[0]["tool_calls"][0]["function"]["arguments"].dump(), R"({"zeta":1,"alpha":2})");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["properties"].dump(), R"({"zeta":{},"alpha":{}})");
}

TEST(OpenAiRequest, ChatPassThroughsHaveTheirTypes) {
  expect_error(chat_error({{"tools", {{"type", "function"}}}}), 400, "tools", "invalid_type",
               {"expected an array", "found an object"});
  expect_error(chat_error({{"tool_choice", 3}}), 400, "tool_choice", "invalid_type",
               {"expected a string or an object", "found integer 3"});
  expect_error(chat_error({{"tool_choice", {{"type", "function"}}}}), 400, "tool_choice", "invalid_value",
               {"expected {\"type\": \"function\", \"function\": {\"name\": ...}}"});
  expect_error(chat_error({{"chat_template_kwargs", "thinking"}}), 400, "chat_template_kwargs", "invalid_type",
               {"expected an object"});
  // A server that does not pass the grammar on refuses what it would not enforce.
  expect_error(chat_error({{"response_format", {{"type", "json_object"}}}}), 400, "response_format", "unsupported_value",
               {"does not enforce structured output"});
  ApiConfig structured = kConfig;
  structured.structured_output = true;
  EXPECT_EQ(parse_chat_request(chat_body({{"response_format", {{"type", "json_object"}}}}).dump(), structured).response_format,
            ojson({{"type", "json_object"}}));
  expect_error(chat_error({{"response_format", {{"type", "json_schema"}, {"json_schema", {{"schema", {{"type", "string"}, {"format", "uri"}}}}}}}}),
               400, "response_format", "unsupported_value", {"the keyword \"format\""});
  expect_error(chat_error({{"response_format", "json"}}), 400, "response_format", "invalid_type",
               {"found string \"json\""});
}

TEST(OpenAiRequest, Prompt) {
  using Tokens = std::vector<int32_t>;
  EXPECT_EQ(std::get<std::string>(completion().prompt), "Once upon");
  EXPECT_EQ(std::get<std::string>(completion({{"prompt", ""}}).prompt), "");
  EXPECT_EQ(std::get<Tokens>(completion({{"prompt", {1, 2, 999}}}).prompt), (Tokens{1, 2, 999}));
  // A batch of one is that prompt.
  EXPECT_EQ(std::get<std::string>(completion({{"prompt", {"only"}}}).prompt), "only");
  EXPECT_EQ(std::get<Tokens>(completion({{"prompt", {{5, 6}}}}).prompt), (Tokens{5, 6}));

  expect_error(completion_error({{"prompt", {"a", "b"}}}), 400, "prompt", "unsupported_value",
               {"expected a single prompt", "found an array of 2 elements"});
  expect_error(completion_error({{"prompt", {{1}, {2}}}}), 400, "prompt", "unsupported_value",
               {"found an array of 2 elements"});
  expect_error(completion_error({{"prompt", json::array()}}), 400, "prompt", "invalid_value",
               {"expected a non-empty array of token ids", "found an array of 0 elements"});
  expect_error(completion_error({{"prompt", {json::array()}}}), 400, "prompt[0]", "invalid_value",
               {"found an array of 0 elements"});
  expect_error(completion_error({{"prompt", {1, 1000}}}), 400, "prompt[1]", "invalid_value",
               {"expected a token id in [0, 1000)", "found integer 1000"});
  expect_error(completion_error({{"prompt", {-1}}}), 400, "prompt[0]", "invalid_value", {"found integer -1"});
  expect_error(completion_error({{"prompt", {1, "a"}}}), 400, "prompt[1]", "invalid_type", {"found string \"a\""});
  expect_error(completion_error({{"prompt", {{1, 2.5}}}}), 400, "prompt[0][1]", "invalid_type",
               {"found number 2.5"});
  expect_error(completion_error({{"prompt", 5}}), 400, "prompt", "invalid_type",
               {"expected a string, or an array of token ids", "found integer 5"});
  json body = completion_body();
  body.erase("prompt");
  expect_error(error_of(parse_completion_request, body.dump()), 400, "prompt", "missing_required_parameter",
               {"found nothing"});
}

TEST(OpenAiRequest, CompletionOnlyFeatures) {
  EXPECT_EQ(completion({{"echo", false}, {"suffix", ""}}).gen.model, "dsv41-tiny");
  EXPECT_TRUE(completion({{"echo", true}}).echo);
  EXPECT_FALSE(completion({{"echo", false}}).echo);
  const CompletionRequest scored = completion({{"echo", true}, {"logprobs", 2}});  // the prompt's logprobs too
  EXPECT_TRUE(scored.echo);
  EXPECT_EQ(scored.gen.logprobs.top, 2);
  expect_error(completion_error({{"suffix", "end"}}), 400, "suffix", "unsupported_value",
               {"expected an empty string", "found string \"end\""});
}

TEST(OpenAiRequest, LongStringsAreShortenedInMessages) {
  const std::string model(100, 'm');
  const ApiError e = chat_error({{"model", model}});
  EXPECT_NE(std::string(e.what()).find("\"" + std::string(40, 'm') + "\"... (100 bytes)"), std::string::npos)
      << e.what();
}

TEST(OpenAiRequest, ContextLength) {
  EXPECT_NO_THROW(check_context_length(100, 28, 128));
  EXPECT_NO_THROW(check_context_length(127, std::nullopt, 128));
  try {
    check_context_length(100, 29, 128);
    ADD_FAILURE() << "accepted 100 + 29 tokens in a context of 128";
  } catch (const ApiError& e) {
    expect_error(e, 400, "max_tokens", "context_length_exceeded",
                 {"expected at most 128 tokens", "found 100 prompt tokens + 29 = 129"});
  }
  try {
    check_context_length(128, std::nullopt, 128);
    ADD_FAILURE() << "accepted a 128-token prompt in a context of 128 with no room to generate";
  } catch (const ApiError& e) {
    expect_error(e, 400, "prompt", "context_length_exceeded", {"expected fewer than 128 tokens", "found 128"});
  }
}

TEST(OpenAiError, BodyShape) {
  const ApiError e(400, "n: expected 1, found integer 2", "n", "unsupported_value");
  EXPECT_EQ(e.body(), json::parse(R"({"error": {"message": "n: expected 1, found integer 2",
      "type": "invalid_request_error", "param": "n", "code": "unsupported_value"}})"));
  const ApiError bare(503, "queue full", "", "", "server_error");
  EXPECT_EQ(bare.body(), json::parse(R"({"error": {"message": "queue full", "type": "server_error",
      "param": null, "code": null}})"));
}

// ---- responses --------------------------------------------------------------------------------

const ResponseMeta kMeta{"chatcmpl-abc", 1700000000, "dsv41-tiny"};

TEST(OpenAiResponse, ChatCompletion) {
  ChatChoice c;
  c.content = "Hello!";
  c.finish_reason = FinishReason::Length;
  EXPECT_EQ(chat_completion_json(kMeta, std::span(&c, 1), {12, 3, 8}), json::parse(R"({
    "id": "chatcmpl-abc", "object": "chat.completion", "created": 1700000000, "model": "dsv41-tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello!"},
                 "logprobs": null, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
              "prompt_tokens_details": {"cached_tokens": 8, "replayed_tokens": 0}}})"));
}

TEST(OpenAiResponse, ChatCompletionWithReasoningAndToolCalls) {
  ChatChoice c;
  c.reasoning_content = "The user wants the weather.";
  c.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}};
  c.finish_reason = FinishReason::ToolCalls;
  const json j = chat_completion_json(kMeta, std::span(&c, 1), {});
  EXPECT_EQ(j["choices"][0]["message"], json::parse(R"({"role": "assistant", "content": null,
      "reasoning_content": "The user wants the weather.",
      "tool_calls": [{"id": "call_1", "type": "function",
                      "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]})"));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  // Content next to tool calls stays.
  c.content = "Let me check.";
  EXPECT_EQ(chat_completion_json(kMeta, std::span(&c, 1), {})["choices"][0]["message"]["content"], "Let me check.");
}

// A reply that ended inside its reasoning (thinking on, max_tokens too small) says so: its content
// is empty and "reasoning_only" is true, in the response and in a stream's last chunk; a reply
// with an answer or a tool call does not carry the field.
TEST(OpenAiResponse, ReasoningOnlyIsFlagged) {
  ChatChoice c;
  c.reasoning_content = "Let me think about";
  c.finish_reason = FinishReason::Length;
  json j = chat_completion_json(kMeta, std::span(&c, 1), {});
  EXPECT_EQ(j["choices"][0]["message"]["content"], "");
  EXPECT_EQ(j["choices"][0]["reasoning_only"], true);
  c.content = "Yes.";
  EXPECT_FALSE(chat_completion_json(kMeta, std::span(&c, 1), {})["choices"][0].contains("reasoning_only"));
  c.content.clear();
  c.tool_calls = {{"call_1", "f", "{}"}};
  EXPECT_FALSE(chat_completion_json(kMeta, std::span(&c, 1), {})["choices"][0].contains("reasoning_only"));
  ChatDelta end;
  end.finish_reason = FinishReason::Length;
  EXPECT_FALSE(chat_chunk_json(kMeta, end, false)["choices"][0].contains("reasoning_only"));
  end.reasoning_only = true;
  EXPECT_EQ(chat_chunk_json(kMeta, end, false)["choices"][0]["reasoning_only"], true);
}

TEST(OpenAiResponse, ChatLogprobs) {
  ChatChoice c;
  c.content = "Hi\xe2\x82\xac";
  // The second token is the first two bytes of "€" (e2 82 ac): bytes carries them exactly.
  c.logprobs = std::vector<TokenLogprob>{
      {"Hi", -0.25, {{"Hi", -0.25}, {"Hello", -1.5}}},
      {"\xe2\x82", -std::numeric_limits<double>::infinity(), {}},
  };
  const json j = chat_completion_json(kMeta, std::span(&c, 1), {});
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0], json::parse(R"(
      {"token": "Hi", "logprob": -0.25, "bytes": [72, 105],
       "top_logprobs": [{"token": "Hi", "logprob": -0.25, "bytes": [72, 105]},
                        {"token": "Hello", "logprob": -1.5, "bytes": [72, 101, 108, 108, 111]}]})"));
  const json& second = j["choices"][0]["logprobs"]["content"][1];
  EXPECT_EQ(second["bytes"], json({226, 130}));
  EXPECT_EQ(second["logprob"], -9999.0);
  EXPECT_EQ(second["top_logprobs"], json::array());
  EXPECT_TRUE(j["choices"][0]["logprobs"]["refusal"].is_null());
  // The partial character cannot be a JSON string as is: the body text carries U+FFFD instead.
  EXPECT_NE(json_text(j).find("\"token\":\"\xef\xbf\xbd\""), std::string::npos) << json_text(j);
}

TEST(OpenAiResponse, TextCompletionWithLogprobs) {
  CompletionChoice c;
  c.text = " a\xc3\xa9!";
  // text_offset counts code points: "é" is one, though two bytes.
  c.logprobs = std::vector<TokenLogprob>{
      {" a", -0.5, {{" a", -0.5}, {" the", -1.0}}},
      {"\xc3\xa9", -1.25, {{"\xc3\xa9", -1.25}}},
      {"!", -2.0, {}},
  };
  EXPECT_EQ(text_completion_json({"cmpl-1", 5, "m"}, std::span(&c, 1), {4, 3, 0}), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
    "choices": [{"index": 0, "text": " a\u00e9!", "finish_reason": "stop",
                 "logprobs": {"tokens": [" a", "\u00e9", "!"], "token_logprobs": [-0.5, -1.25, -2.0],
                              "top_logprobs": [{" a": -0.5, " the": -1.0}, {"\u00e9": -1.25}, {}],
                              "text_offset": [0, 2, 3]}}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7,
              "prompt_tokens_details": {"cached_tokens": 0, "replayed_tokens": 0}}})"));
}

// n choices: each in the order given with its index, the usage once for the request.
TEST(OpenAiResponse, SeveralChoices) {
  std::vector<ChatChoice> chats(2);
  chats[0].content = "Yes.";
  chats[1].index = 1;
  chats[1].content = "No.";
  chats[1].finish_reason = FinishReason::Length;
  EXPECT_EQ(chat_completion_json(kMeta, chats, {5, 4, 0}), json::parse(R"({
    "id": "chatcmpl-abc", "object": "chat.completion", "created": 1700000000, "model": "dsv41-tiny",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes."}, "logprobs": null, "finish_reason": "stop"},
                {"index": 1, "message": {"role": "assistant", "content": "No."}, "logprobs": null, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9, "prompt_tokens_details": {"cached_tokens": 0, "replayed_tokens": 0}}})"));
  std::vector<CompletionChoice> texts(3);
  for (int k = 0; k < 3; ++k) texts[size_t(k)].index = k, texts[size_t(k)].text = std::string(size_t(k), 'x');
  const json t = text_completion_json({"cmpl-1", 5, "m"}, texts, {2, 3, 0});
  ASSERT_EQ(t["choices"].size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(t["choices"][k]["index"], k);
    EXPECT_EQ(t["choices"][k]["text"], std::string(size_t(k), 'x'));
  }
  ChatDelta d;
  d.index = 2;
  d.content = "Hi";
  EXPECT_EQ(chat_chunk_json(kMeta, d, false)["choices"][0]["index"], 2);
  CompletionDelta cd;
  cd.index = 1;
  EXPECT_EQ(completion_chunk_json(kMeta, cd, false)["choices"][0]["index"], 1);
}

TEST(OpenAiStream, ChatChunks) {
  ChatDelta first;
  first.role = true;
  first.content = "";
  EXPECT_EQ(chat_chunk_json(kMeta, first, false), json::parse(R"({
    "id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1700000000, "model": "dsv41-tiny",
    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                 "finish_reason": null}]})"));

  ChatDelta think;
  think.reasoning_content = "hmm";
  EXPECT_EQ(chat_chunk_json(kMeta, think, false)["choices"][0]["delta"], json({{"reasoning_content", "hmm"}}));

  ChatDelta last;
  last.finish_reason = FinishReason::Stop;
  const json j = chat_chunk_json(kMeta, last, /*include_usage=*/true);
  EXPECT_EQ(j["choices"][0]["delta"], json::object());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  // With include_usage every chunk before the usage chunk says "usage": null.
  ASSERT_TRUE(j.contains("usage"));
  EXPECT_TRUE(j["usage"].is_null());
  EXPECT_FALSE(chat_chunk_json(kMeta, last, false).contains("usage"));
}

TEST(OpenAiStream, ChatChunkLogprobs) {
  ChatDelta d;
  d.content = "Hi";
  d.logprobs = std::vector<TokenLogprob>{{"Hi", -0.1, {}}};
  EXPECT_EQ(chat_chunk_json(kMeta, d, false)["choices"][0]["logprobs"], json::parse(R"({"content": [
      {"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}], "refusal": null})"));
}

TEST(OpenAiStream, ToolCallDeltas) {
  ChatDelta start;
  start.tool_calls = {{0, "call_1", "get_weather", ""}};
  EXPECT_EQ(chat_chunk_json(kMeta, start, false)["choices"][0]["delta"], json::parse(R"({"tool_calls": [
      {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]})"));
  ChatDelta more;
  more.tool_calls = {{0, "", "", "{\"city\":"}};
  EXPECT_EQ(chat_chunk_json(kMeta, more, false)["choices"][0]["delta"], json::parse(R"({"tool_calls": [
      {"index": 0, "function": {"arguments": "{\"city\":"}}]})"));
}

TEST(OpenAiStream, UsageChunks) {
  EXPECT_EQ(chat_usage_chunk_json(kMeta, {10, 2, 4}), json::parse(R"({
    "id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1700000000, "model": "dsv41-tiny",
    "choices": [],
    "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
              "prompt_tokens_details": {"cached_tokens": 4, "replayed_tokens": 0}}})"));
  // A replay's rows, among the cached ones.
  EXPECT_EQ(chat_usage_chunk_json(kMeta, {80, 2, 64, 16})["usage"]["prompt_tokens_details"],
            json::parse(R"({"cached_tokens": 64, "replayed_tokens": 16})"));
  const json c = completion_usage_chunk_json({"cmpl-1", 5, "m"}, {1, 1, 0});
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"], json::array());
  EXPECT_EQ(c["usage"]["total_tokens"], 2);
}

// Echo with logprobs: the prompt's first token is unscored — null logprob and top_logprobs, as
// vLLM's — and its text counts in the offsets of the tokens after it.
TEST(OpenAiResponse, EchoedPromptLogprobs) {
  CompletionChoice c;
  c.text = "ab!";
  c.logprobs = std::vector<TokenLogprob>{{"a", 0, {}, true}, {"b", -0.5, {{"b", -0.5}}}, {"!", -1, {{"?", -0.25}}}};
  EXPECT_EQ(text_completion_json({"cmpl-1", 5, "m"}, std::span(&c, 1), {2, 1, 0})["choices"][0]["logprobs"], json::parse(R"(
      {"tokens": ["a", "b", "!"], "token_logprobs": [null, -0.5, -1.0], "top_logprobs": [null, {"b": -0.5}, {"?": -0.25}],
       "text_offset": [0, 1, 2]})"));
}

TEST(OpenAiStream, CompletionChunks) {
  CompletionDelta d;
  d.text = "\xc3\xa9t\xc3\xa9";
  d.text_offset = 10;  // ten code points were sent before this chunk
  d.logprobs = std::vector<TokenLogprob>{{"\xc3\xa9", -1, {}}, {"t\xc3\xa9", -2, {}}};
  EXPECT_EQ(completion_chunk_json({"cmpl-1", 5, "m"}, d, false), json::parse(R"({
    "id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
    "choices": [{"index": 0, "text": "\u00e9t\u00e9", "finish_reason": null,
                 "logprobs": {"tokens": ["\u00e9", "t\u00e9"], "token_logprobs": [-1.0, -2.0],
                              "top_logprobs": [{}, {}], "text_offset": [10, 11]}}]})"));
  CompletionDelta end;
  end.finish_reason = FinishReason::Length;
  const json j = completion_chunk_json({"cmpl-1", 5, "m"}, end, true);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["choices"][0]["text"], "");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_TRUE(j.contains("usage") && j["usage"].is_null());
}

TEST(OpenAiStream, SseFraming) {
  ChatDelta d;
  d.content = "line one\nline two\r\n";
  const std::string event = sse_event(chat_chunk_json(kMeta, d, false));
  ASSERT_TRUE(event.starts_with("data: "));
  ASSERT_TRUE(event.ends_with("\n\n"));
  const std::string payload = event.substr(6, event.size() - 8);
  // An event is one data line: the newlines in the text are JSON escapes, not line breaks.
  EXPECT_EQ(payload.find('\n'), std::string::npos);
  EXPECT_EQ(payload.find('\r'), std::string::npos);
  EXPECT_EQ(json::parse(payload)["choices"][0]["delta"]["content"], "line one\nline two\r\n");
  EXPECT_EQ(sse_event(json{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
}

TEST(OpenAiStream, InvalidUtf8IsReplacedNotThrown) {
  ChatDelta d;
  d.content = "ok\xe2\x82";  // a character cut in two by a token boundary
  std::string event;
  ASSERT_NO_THROW(event = sse_event(chat_chunk_json(kMeta, d, false)));
  EXPECT_NE(event.find("\"content\":\"ok\xef\xbf\xbd\""), std::string::npos) << event;
}

TEST(OpenAiResponse, Ids) {
  const std::regex shape("chatcmpl-[0-9a-f]{24}");
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string id = new_response_id("chatcmpl");
    EXPECT_TRUE(std::regex_match(id, shape)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_TRUE(std::regex_match(new_response_id("cmpl"), std::regex("cmpl-[0-9a-f]{24}")));

  const int64_t before = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  const ResponseMeta meta = new_response_meta("cmpl", "dsv41-tiny");
  const int64_t after = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_GE(meta.created, before);
  EXPECT_LE(meta.created, after);
  EXPECT_EQ(meta.model, "dsv41-tiny");
  EXPECT_TRUE(meta.id.starts_with("cmpl-"));
}

TEST(OpenAiResponse, FinishReasons) {
  EXPECT_STREQ(to_string(FinishReason::Stop), "stop");
  EXPECT_STREQ(to_string(FinishReason::Length), "length");
  EXPECT_STREQ(to_string(FinishReason::ToolCalls), "tool_calls");
}

TEST(OpenAiResponse, Models) {
  const std::vector<ModelCard> models{{"dsv41-tiny", 1700000000}, {"other", 1, "someone"}};
  EXPECT_EQ(models_json(models), json::parse(R"({"object": "list", "data": [
      {"id": "dsv41-tiny", "object": "model", "created": 1700000000, "owned_by": "dsv41"},
      {"id": "other", "object": "model", "created": 1, "owned_by": "someone"}]})"));
}

}  // namespace

// Fields of OpenAI's and vLLM's APIs that dsv41 does not implement and whose being ignored would
// change the result are refused, naming what to send instead — unless null or at the value that
// asks for nothing; fields that change nothing are accepted.
TEST(OpenAiRequest, UnimplementedFieldsAreRefusedNotIgnored) {
  const std::vector<std::pair<std::string, json>> both = {
      {"min_tokens", 4}, {"stop_token_ids", {7}}, {"include_stop_str_in_output", true}, {"use_beam_search", true},
      {"prompt_logprobs", 1}, {"guided_json", json::object()}, {"guided_regex", "a+"}, {"guided_choice", {"a", "b"}},
      {"guided_grammar", "root ::= \"a\""}, {"structured_outputs", {{"json", json::object()}}}, {"bad_words", {"x"}},
      {"allowed_token_ids", {1, 2}}, {"logits_processors", {"m.f"}}, {"truncate_prompt_tokens", 8},
      {"skip_special_tokens", true}, {"return_tokens_as_token_ids", true}};
  for (const auto& [key, value] : both) {
    expect_error(chat_error({{key, value}}), 400, key, "unsupported_value", {key + ": expected "});
    expect_error(completion_error({{key, value}}), 400, key, "unsupported_value", {key + ": expected "});
  }
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{
           {"functions", json::array({{{"name", "f"}}})}, {"function_call", "auto"}, {"modalities", {"text", "audio"}},
           {"audio", {{"voice", "alloy"}}}, {"chat_template", "{{ messages }}"}, {"add_generation_prompt", false},
           {"continue_final_message", true}, {"echo", true}})
    expect_error(chat_error({{key, value}}), 400, key, "unsupported_value", {key + ": expected "});
  expect_error(chat_error({{"functions", json::array({{{"name", "f"}}})}}), 400, "functions", "unsupported_value", {"send \"tools\""});
  // At the value that asks for nothing, or null: accepted.
  EXPECT_EQ(chat({{"min_tokens", 0}, {"stop_token_ids", json::array()}, {"include_stop_str_in_output", false},
                  {"use_beam_search", false}, {"prompt_logprobs", nullptr}, {"modalities", {"text"}}, {"functions", nullptr},
                  {"add_generation_prompt", true}, {"skip_special_tokens", false}, {"echo", false}})
                .gen.model,
            "dsv41-tiny");
  EXPECT_TRUE(completion({{"echo", true}, {"skip_special_tokens", false}}).echo);  // completions' own echo
  json stream = {{"stream", true}, {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
  expect_error(chat_error(stream), 400, "stream_options.continuous_usage_stats", "unsupported_value", {"include_usage"});
  stream["stream_options"]["continuous_usage_stats"] = false;
  EXPECT_TRUE(chat(stream).gen.include_usage);
  // Fields that change nothing of the result: accepted (docs/openai-api.md lists them).
  EXPECT_EQ(chat({{"store", true}, {"service_tier", "auto"}, {"prediction", {{"type", "content"}, {"content", "x"}}}}).gen.model,
            "dsv41-tiny");
}

}  // namespace dsv41
