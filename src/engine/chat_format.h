#pragma once
// DeepSeek-V4.1's chat format: OpenAI-style messages rendered into the prompt text exactly as the
// official encoder renders them (encoding/encoding.py of the deepseek-ai/DeepSeek-V4.1-Flash
// model repository), and the model's reply split back into reasoning, content and tool calls.
// The format, its source and the choices made here are in docs/chat-format.md.
//
//   auto messages = chat_messages_from_json(request["messages"]);
//   ChatOptions options;                          // thinking on, effort 75, no tools
//   options.tools = chat_tools_from_json(request["tools"]);
//   std::string prompt = render_chat(messages, options);
//   std::vector<int> ids = tokenizer.encode(prompt, /*add_special_tokens=*/false);
//
//   ReplyParser parser(options.thinking);        // as the model's text arrives
//   ReplyDelta d = parser.push(piece);           // reasoning / content / finished tool calls
//   ReplyDelta rest = parser.finish();           // at the end of the reply
//
// JSON is taken as nlohmann::ordered_json: the official encoder writes tool schemas and
// arguments in the order the client sent their keys, which a sorted map would lose.
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dsv41 {

class Tokenizer;

// The marker strings of the format (all of them special tokens in V4.1's own tokenizer).
namespace chat_token {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kSystem = "<｜System｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kDsml = "｜DSML｜";
// What an image part becomes in the prompt text (encoding.py's IMAGE_PLACEHOLDER); the engine
// turns each into its image's span (engine/prompt_image.h, encode_with_images).
inline constexpr std::string_view kImage = "<｜deepseek_image｜>";
}  // namespace chat_token

enum class ChatRole { system, user, assistant, tool };

struct ChatToolCall {
  std::string id;         // may be empty; orders the tool results that answer the calls
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ChatMessage {
  ChatRole role = ChatRole::user;
  // An array of parts arrives joined with "\n\n", as the official encoder joins content blocks,
  // each image part as chat_token::kImage.
  std::string content;
  std::optional<std::string> reasoning_content;  // assistant only
  std::vector<ChatToolCall> tool_calls;          // assistant only
  std::string tool_call_id;                      // tool only
  std::string name;                              // accepted; the format does not render it
  std::vector<std::string> image_urls;           // user only: the image parts' URLs, in order
};

// OpenAI chat messages: an array of {"role", "content", ...}. Roles system, user, assistant and
// tool; content a string or an array of {"type": "text", "text"} parts (null for an assistant
// with tool calls), a user's parts also {"type": "image_url", "image_url": {"url"}} (or the URL
// as a string, as encoding.py reads it); assistant "tool_calls" [{"id", "function": {"name",
// "arguments"}}] with arguments a JSON object or its text. Text that spells chat_token::kImage is
// refused, as the official encoder refuses it: images come as image parts. Throws dsv41::Error
// naming the message and field.
std::vector<ChatMessage> chat_messages_from_json(const nlohmann::ordered_json& messages);

// The image URLs of the messages in the order render_chat writes their placeholders (a user
// turn's parts keep their order; only tool results are reordered).
std::vector<std::string> chat_image_urls(std::span<const ChatMessage> messages);

// OpenAI "tools": [{"type": "function", "function": {"name", ...}}]; null gives none. Returns
// each tool's "function" object, which is what the format writes into the prompt.
std::vector<nlohmann::ordered_json> chat_tools_from_json(const nlohmann::ordered_json& tools);

// "low" 50, "high" 75, "max" 100, or an integer 1..100 (the official mapping; default "high").
int reasoning_effort_from_json(const nlohmann::ordered_json& effort);

struct ChatOptions {
  // Thinking mode: the reply opens with reasoning (the prompt ends with <think>); off, the
  // prompt ends with </think> and the reply is the answer. On by default, as DeepSeek's API.
  bool thinking = true;
  int reasoning_effort = 75;  // 1..100; written into the prompt in thinking mode only
  // Each a tool's "function" object; written after the system prompt. With tools, earlier
  // turns keep their reasoning (the official encoder's rule).
  std::vector<nlohmann::ordered_json> tools;
  // Reasoning of assistant turns before the last user turn is left out (official default).
  bool drop_thinking = true;
  // The assistant header that follows a final user (or later system) turn; false leaves it
  // off, for a prompt that is only a prefix of a longer conversation.
  bool add_generation_prompt = true;
};

// The prompt text, BOS first. Throws dsv41::Error for an empty conversation, an effort outside
// 1..100, or tool-call arguments that are not the text of a JSON object.
std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& options);

// The ids that end a reply: the end-of-sentence token. Throws dsv41::Error when the tokenizer
// has no such token.
std::vector<int> chat_stop_token_ids(const Tokenizer& tokenizer);

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

// What one push of reply text adds. Tool calls come whole, when their block has closed.
struct ReplyDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// Splits the model's reply as it is generated: reasoning up to </think> (thinking mode), then
// the answer up to the end-of-sentence token, with a tool-call block ("\n\n<｜DSML｜ calls>" …
// "</｜DSML｜ calls>") turned into tool calls. Pieces may cut a marker anywhere: text that
// could still be the start of a marker is held back until the next piece decides it. The model's
// output is never refused: a tool-call block that does not parse is passed on as content, and
// text after the end-of-sentence token is ignored.
class ReplyParser {
 public:
  explicit ReplyParser(bool thinking);
  ReplyDelta push(std::string_view text);
  // The end of the reply: what was held back is released (an unclosed tool-call block as
  // content). Further pushes are ignored.
  ReplyDelta finish();
  // True once the end-of-sentence text or finish() was seen.
  bool ended() const { return state_ == State::ended; }

 private:
  enum class State { reasoning, content, tool_calls, ended };
  void run(ReplyDelta& out, bool final);
  State state_;
  std::string pending_;
};

struct ParsedReply {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
};

// A whole reply at once (what ReplyParser gives over any cutting of it).
ParsedReply parse_reply(std::string_view text, bool thinking);

}  // namespace dsv41
