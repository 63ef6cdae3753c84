#pragma once
// The OpenAI-compatible request/response layer, free of HTTP and of the engine: request bodies of
// POST /v1/chat/completions and POST /v1/completions are validated into plain structs, and
// results are turned into the JSON objects (and SSE events) that OpenAI clients expect. Every
// rule is stated in docs/openai-api.md. Only the server's translation units include this header
// (it brings nlohmann/json with it).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace dsv41 {

// A request the server refuses: the HTTP status and the OpenAI error object
// {"error": {"message", "type", "param", "code"}}. An empty param or code is sent as null.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error");
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }
  const std::string& type() const { return type_; }
  nlohmann::json body() const;

 private:
  int status_;
  std::string param_, code_, type_;
};

// What the parser needs to know of the server.
struct ApiConfig {
  std::vector<std::string> models;  // ids accepted in "model" (anything else is 404)
  int64_t vocab_size = 0;           // token ids in a completions prompt must be below this
  // Whether the server passes output_grammar() on to its requests: without, a response_format
  // other than text and a tool_choice that requires a call are refused (400), not ignored.
  bool structured_output = false;
  // The most choices a request may ask for (`n`): the sequences one batch runs (serve --max-running).
  int max_choices = 1;
};

struct RequestSampling {
  float temperature = 1.0f;  // 0 = greedy (every number as the engine's fp32 sampler takes it)
  float top_p = 1.0f;        // (0, 1]
  int32_t top_k = 0;         // 0 = off; a request's -1 also means off and is stored as 0
  float min_p = 0.0f;        // [0, 1]; 0 = off
  std::optional<int64_t> seed;
  std::vector<std::string> stop;     // at most 4, none empty
  std::optional<int32_t> max_tokens;  // none: until a stop or the context ends
  bool ignore_eos = false;            // vLLM's extension: the end-of-sequence token does not end the reply
  bool speculative = true;            // dsv41's: false opts out of the server's speculative decoding
  float presence_penalty = 0.0f;      // [-2, 2], OpenAI's
  float frequency_penalty = 0.0f;     // [-2, 2], OpenAI's
  float repetition_penalty = 1.0f;    // (0, 10], vLLM's extension; 1 = off
  std::vector<std::pair<int, float>> logit_bias;  // token id → [-100, 100], ascending ids
};

struct LogprobsParams {
  bool enabled = false;  // report the chosen token's logprob
  int32_t top = 0;       // and this many alternatives (0..20)
};

// What both endpoints share.
struct GenerationParams {
  std::string model;
  int n = 1;  // choices, in [1, ApiConfig::max_choices]
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  RequestSampling sampling;
  LogprobsParams logprobs;
};

struct ChatRequest {
  GenerationParams gen;
  // Kept as JSON, keys in the client's order, for the chat format (src/engine/chat_format.h):
  // messages is a non-empty array of objects with a string "role"; the others are null when the
  // request leaves them out, and only their JSON type is checked here.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;                 // array
  nlohmann::ordered_json tool_choice;           // string or object
  nlohmann::ordered_json reasoning_effort;      // for reasoning_effort_from_json
  nlohmann::ordered_json chat_template_kwargs;  // object (e.g. {"thinking": false})
  // Structured output (docs/openai-api.md): checked here, schemas included (a keyword outside the
  // subset is a 400 naming it); output_grammar() builds the grammar.
  nlohmann::ordered_json response_format;  // null, or {"type": "json_object"} / {"type": "json_schema", ...}
  bool parallel_tool_calls = true;
};

namespace grammar {
class Grammar;
class GrammarCache;
}  // namespace grammar

// The grammar a chat request's reply must follow, from `cache`: the tool-call block of the tool
// chosen (tool_choice a function) or of any tool ("required"), a reply without one ("none" with
// tools), else response_format's JSON; null when the reply is free. A GenerationRequest takes it
// as `grammar`, with `grammar_after` "</think>" in thinking mode (the grammar binds the answer).
std::shared_ptr<grammar::Grammar> output_grammar(const ChatRequest& request, grammar::GrammarCache& cache);

struct CompletionRequest {
  GenerationParams gen;
  std::variant<std::string, std::vector<int32_t>> prompt;  // text, or token ids
  // The text starts with the prompt's; with logprobs, the logprobs start with the prompt's tokens'
  // (gen.logprobs.top alternatives each, the first token unscored).
  bool echo = false;
};

// Both throw ApiError (400; 404 for a model not in config.models).
ChatRequest parse_chat_request(std::string_view body, const ApiConfig& config);

// POST /tokenize (as vLLM has it): {"model", "prompt": text, "add_special_tokens": bool = true},
// or a chat request ({"model", "messages", ...}, rendered as /v1/chat/completions renders it).
struct TokenizeRequest {
  std::optional<std::string> prompt;
  std::optional<ChatRequest> chat;
  bool add_special_tokens = true;
};
TokenizeRequest parse_tokenize_request(std::string_view body, const ApiConfig& config);
// {"count", "max_model_len", "tokens"}
nlohmann::json tokenize_json(std::span<const int> tokens, int64_t max_model_len);
// POST /detokenize: {"model", "tokens": [ids in the vocabulary]} → the ids.
std::vector<int32_t> parse_detokenize_request(std::string_view body, const ApiConfig& config);
CompletionRequest parse_completion_request(std::string_view body, const ApiConfig& config);

// After tokenizing: the prompt plus max_tokens must fit the context (without max_tokens, at least
// one token must). Throws ApiError 400, code "context_length_exceeded".
void check_context_length(int64_t prompt_tokens, std::optional<int32_t> max_tokens, int64_t context_length);

// ---- responses --------------------------------------------------------------------------------

enum class FinishReason { Stop, Length, ToolCalls };
const char* to_string(FinishReason reason);

// A response's token counts (docs/openai-api.md, "usage"): the prompt's tokens; of them the cached
// ones (their KV from the KV tiers or a sequence on the device, not computed), and of those the
// replayed ones (rerun to rebuild sliding-window KV: PrefixUse::replayed); the prompt's image-span
// tokens (dsv41's image_tokens, sent when not 0); the tokens generated.
struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0, replayed_tokens = 0, image_tokens = 0;
};

// One generated token's logprob and, when asked, the best alternatives at its position. Token
// texts are raw bytes (a token may hold part of a UTF-8 character); chat logprobs carry them
// exactly in "bytes", and JSON strings show invalid UTF-8 as U+FFFD. A logprob of -inf is sent
// as -9999.0, as OpenAI does (JSON has no infinity).
struct TopLogprob {
  std::string token;
  double logprob = 0;
};
struct TokenLogprob {
  std::string token;
  double logprob = 0;
  std::vector<TopLogprob> top;
  // The prompt's first token (completions' echo with logprobs): nothing predicts it, so its
  // logprob and top_logprobs are sent as null, as vLLM's.
  bool unscored = false;
};

struct ResponseMeta {
  std::string id;  // new_response_id()
  int64_t created = 0;  // Unix seconds
  std::string model;
};
// prefix "chatcmpl" or "cmpl": "<prefix>-" and 24 random hex digits.
std::string new_response_id(std::string_view prefix);
// A fresh id with the current time.
ResponseMeta new_response_meta(std::string_view prefix, std::string model);

struct ToolCall {
  std::string id, name, arguments;  // arguments: the JSON text the model wrote
};

struct ChatChoice {
  int index = 0;                  // of the request's n choices
  std::string content;            // null in the message when empty and tool calls are present
  std::string reasoning_content;  // left out of the message when empty
  std::vector<ToolCall> tool_calls;
  FinishReason finish_reason = FinishReason::Stop;
  std::optional<std::vector<TokenLogprob>> logprobs;  // present iff the request asked
  // The reply ended inside its reasoning (thinking mode, max_tokens too small): no answer came.
  // Said in the choice as "reasoning_only": true (dsv41's), the content being empty.
  bool reasoning_only() const { return content.empty() && tool_calls.empty() && !reasoning_content.empty(); }
};
// The choices in the order given (the server gives them by index).
nlohmann::json chat_completion_json(const ResponseMeta& meta, std::span<const ChatChoice> choices, const Usage& usage);

struct CompletionChoice {
  int index = 0;
  std::string text;
  FinishReason finish_reason = FinishReason::Stop;
  std::optional<std::vector<TokenLogprob>> logprobs;
};
nlohmann::json text_completion_json(const ResponseMeta& meta, std::span<const CompletionChoice> choices, const Usage& usage);

// ---- streaming --------------------------------------------------------------------------------
// A stream sends, per choice, one chunk with role "assistant" first, then content chunks, then one
// chunk with the finish reason (the choices' chunks interleaved, each with its index); then
// (include_usage) the usage chunk, then sse_done(). With include_usage every chunk but the last
// carries "usage": null, as OpenAI's do.

struct ToolCallDelta {
  int index = 0;
  std::string id, name;  // sent only when non-empty (the first delta of a call)
  std::string arguments;
};

struct ChatDelta {
  int index = 0;      // the choice's
  bool role = false;  // "role": "assistant"
  std::optional<std::string> content, reasoning_content;
  std::vector<ToolCallDelta> tool_calls;
  std::optional<FinishReason> finish_reason;
  std::optional<std::vector<TokenLogprob>> logprobs;
  bool reasoning_only = false;  // with the finish: ChatChoice::reasoning_only of the whole reply
};
nlohmann::json chat_chunk_json(const ResponseMeta& meta, const ChatDelta& delta, bool include_usage);

struct CompletionDelta {
  int index = 0;  // the choice's
  std::string text;
  std::optional<FinishReason> finish_reason;
  std::optional<std::vector<TokenLogprob>> logprobs;
  int64_t text_offset = 0;  // code points of the logprobs' tokens sent before this chunk
};
nlohmann::json completion_chunk_json(const ResponseMeta& meta, const CompletionDelta& delta, bool include_usage);

// The last chunk before [DONE] when include_usage: "choices": [] and the usage.
nlohmann::json chat_usage_chunk_json(const ResponseMeta& meta, const Usage& usage);
nlohmann::json completion_usage_chunk_json(const ResponseMeta& meta, const Usage& usage);

// Code points in a byte string: the bytes that do not continue a UTF-8 sequence (text_offset's unit).
int64_t code_points(std::string_view text);

// The JSON text of a body or event: compact (one line), invalid UTF-8 replaced by U+FFFD rather
// than throwing.
std::string json_text(const nlohmann::json& value);
// "data: <json>\n\n" and "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json& value);
std::string sse_done();

// ---- GET /v1/models ---------------------------------------------------------------------------

struct ModelCard {
  std::string id;
  int64_t created = 0;
  std::string owned_by = "dsv41";
};
nlohmann::json models_json(std::span<const ModelCard> models);
// One model object (GET /v1/models/{id}: the SDKs' models.retrieve).
nlohmann::json model_json(const ModelCard& model);

}  // namespace dsv41
