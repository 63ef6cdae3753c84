#include "engine/chat_format.h"

#include <algorithm>
#include <map>

#include "base/error.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

using nlohmann::ordered_json;
using namespace chat_token;

namespace {

// ---------------------------------------------------------------- JSON helpers

// A short description of a JSON value for error messages.
std::string describe(const ordered_json& v) {
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s.size() > 40) s = s.substr(0, 40) + "...";
    return ordered_json(s).dump();
  }
  if (v.is_number() || v.is_boolean()) return v.type_name() + std::string(" ") + v.dump();
  if (v.is_null()) return "null";
  return std::string("an ") + v.type_name();
}

// JSON as Python's json.dumps(value, ensure_ascii=False) writes it, which is what the official
// encoder puts into the prompt: ", " between items and ": " after keys, keys in their given
// order, non-ASCII characters as they are. Scalars are written by nlohmann, whose escapes
// (\" \\ \n \r \t \b \f, \u00xx for other control characters) and shortest round-trip numbers
// ("1.0", "1e-07", "1e+100") are Python's too.
void python_json(const ordered_json& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) out += ", ";
      first = false;
      out += ordered_json(key).dump();
      out += ": ";
      python_json(value, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      python_json(v[i], out);
    }
    out += ']';
  } else {
    out += v.dump();
  }
}

std::string python_json(const ordered_json& v) {
  std::string out;
  python_json(v, out);
  return out;
}

// A JSON string literal of `s`; bytes that are not UTF-8 (a quote cut inside a character, a
// model's stray bytes) become U+FFFD, where dump() would throw (the fuzzer found it aborting).
std::string json_string(std::string_view s) {
  return ordered_json(std::string(s)).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// Tool-call arguments given as text, parsed at most kMaxArgumentDepth levels deep: rendering walks
// them recursively (python_json), and text nested 100,000 deep inside a small request would
// otherwise overflow the stack. Request bodies have the same bound (server/openai_api.cpp).
constexpr int kMaxArgumentDepth = 128;

ordered_json parse_arguments(const std::string& text, const std::string& at, const std::string& expected) {
  const ordered_json::parser_callback_t bound = [&](int depth, ordered_json::parse_event_t, ordered_json&) {
    if (depth > kMaxArgumentDepth)
      fail(at, expected + " nested at most " + std::to_string(kMaxArgumentDepth) + " levels deep", "deeper nesting");
    return true;
  };
  try {
    return ordered_json::parse(text, bound);
  } catch (const nlohmann::json::exception&) {
    fail(at, expected, "text that is not JSON: " + json_string(text.substr(0, 40)));
  }
}

// ---------------------------------------------------------------- the format's fixed texts

std::string reasoning_effort_text(int effort) {
  return "Reasoning Effort: " + std::to_string(effort) +
         " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
}

// The tool section that follows the system prompt. Its wording is the official encoder's
// TOOLS_TEMPLATE with the V4.1 tag names filled in; it ends with a newline.
std::string tools_text(const std::vector<ordered_json>& tools) {
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (i) schemas += '\n';
    schemas += python_json(tools[i]);
  }
  return R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜ calls>" block like the following:

<｜DSML｜ calls>
<｜DSML｜ invoke name="$TOOL_NAME">
<｜DSML｜ parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜ parameter>
...
</｜DSML｜ invoke>
<｜DSML｜ invoke name="$TOOL_NAME2">
...
</｜DSML｜ invoke>
</｜DSML｜ calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

)" + schemas +
         R"(

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)";
}

const std::string kCallsOpen = "<" + std::string(kDsml) + " calls>";
const std::string kCallsClose = "</" + std::string(kDsml) + " calls>";
const std::string kInvokeOpen = "<" + std::string(kDsml) + " invoke name=\"";
const std::string kInvokeClose = "</" + std::string(kDsml) + " invoke>";
const std::string kParamOpen = "<" + std::string(kDsml) + " parameter name=\"";
const std::string kParamClose = "</" + std::string(kDsml) + " parameter>";
// The model opens a tool-call block after a blank line (the renderer writes it so).
const std::string kCallsStart = "\n\n" + kCallsOpen;

// An assistant's tool calls as the block the model is trained to write: string arguments as
// they are, others as (Python-style) JSON.
std::string tool_calls_text(const ChatMessage& m, const std::string& where) {
  std::string out = kCallsStart + "\n";
  for (size_t i = 0; i < m.tool_calls.size(); ++i) {
    const ChatToolCall& call = m.tool_calls[i];
    std::string at = where + ".tool_calls[" + std::to_string(i) + "].function.arguments";
    const ordered_json args = parse_arguments(call.arguments, at, "a JSON object");
    if (!args.is_object()) fail(at, "a JSON object", describe(args));
    if (i) out += '\n';
    out += kInvokeOpen + call.name + "\">\n";
    bool first = true;
    for (const auto& [key, value] : args.items()) {
      if (!first) out += '\n';
      first = false;
      out += kParamOpen + key + "\" string=\"" + (value.is_string() ? "true" : "false") + "\">";
      out += value.is_string() ? value.get<std::string>() : python_json(value);
      out += kParamClose;
    }
    out += "\n" + kInvokeClose;
  }
  out += "\n" + kCallsClose;
  return out;
}

// ---------------------------------------------------------------- rendering

// A message after the official preprocessing: tool results become blocks of a user turn, and
// consecutive user turns (with the tool results between them) are one turn.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string call_id;
};

struct Turn {
  ChatRole role = ChatRole::user;     // system, user or assistant
  const ChatMessage* message = nullptr;  // system and assistant
  size_t index = 0;                      // in the caller's messages, for errors
  std::vector<Block> blocks;             // user
};

std::vector<Turn> merge_turns(std::span<const ChatMessage> messages) {
  std::vector<Turn> turns;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == ChatRole::user || m.role == ChatRole::tool) {
      Block b = m.role == ChatRole::tool ? Block{true, m.content, m.tool_call_id} : Block{false, m.content, {}};
      if (turns.empty() || turns.back().role != ChatRole::user) turns.push_back(Turn{ChatRole::user, nullptr, i, {}});
      turns.back().blocks.push_back(std::move(b));
    } else {
      turns.push_back(Turn{m.role, &m, i, {}});
    }
  }
  return turns;
}

// Tool results are put in the order of the calls they answer (the latest assistant turn with
// tool calls gives it; a result whose id names no call sorts as the first call). Other blocks
// keep their places; the sort is stable, as Python's sorted().
void sort_tool_results(std::vector<Turn>& turns) {
  std::map<std::string, size_t> order;
  for (Turn& t : turns) {
    if (t.role == ChatRole::assistant && !t.message->tool_calls.empty()) {
      order.clear();
      for (size_t i = 0; i < t.message->tool_calls.size(); ++i)
        if (!t.message->tool_calls[i].id.empty()) order[t.message->tool_calls[i].id] = i;
    } else if (t.role == ChatRole::user && !order.empty()) {
      std::vector<Block*> results;
      for (Block& b : t.blocks)
        if (b.tool_result) results.push_back(&b);
      if (results.size() < 2) continue;
      std::vector<Block> sorted;
      for (Block* b : results) sorted.push_back(*b);
      auto rank = [&](const Block& b) {
        auto it = order.find(b.call_id);
        return it == order.end() ? size_t{0} : it->second;
      };
      std::stable_sort(sorted.begin(), sorted.end(), [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      for (size_t i = 0; i < results.size(); ++i) *results[i] = std::move(sorted[i]);
    }
  }
}

}  // namespace

std::string render_chat(std::span<const ChatMessage> messages, const ChatOptions& options) {
  if (messages.empty()) fail("messages", "at least one message", "none");
  if (options.reasoning_effort < 1 || options.reasoning_effort > 100)
    fail("reasoning_effort", "an integer 1..100", std::to_string(options.reasoning_effort));

  // Tools belong to the first system message; without one, the official library gives them a
  // system message of their own, empty but for the tools.
  std::vector<ChatMessage> with_system;
  if (!options.tools.empty() && messages.front().role != ChatRole::system) {
    with_system.push_back(ChatMessage{ChatRole::system, {}, {}, {}, {}, {}, {}});
    with_system.insert(with_system.end(), messages.begin(), messages.end());
    messages = with_system;
  }
  std::vector<Turn> turns = merge_turns(messages);
  sort_tool_results(turns);

  // With tools, earlier reasoning is kept whatever drop_thinking says (official rule).
  const bool drop = options.drop_thinking && options.tools.empty();
  const bool thinking = options.thinking;
  // The last user turn; a system turn after the first counts as one.
  size_t last_user = 0;
  bool any_user = false;
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i].role == ChatRole::user || (turns[i].role == ChatRole::system && i > 0)) last_user = i, any_user = true;

  std::string out(kBos);
  for (size_t i = 0; i < turns.size(); ++i) {
    const Turn& t = turns[i];
    // The first turn opens with the system token when it is a system turn or when thinking
    // mode puts the effort line there.
    if (i == 0 && (thinking || t.role == ChatRole::system)) out += kSystem;
    if (i == 0 && thinking) out += reasoning_effort_text(options.reasoning_effort);

    switch (t.role) {
      case ChatRole::system:
        if (i > 0) out += kSystem;
        out += t.message->content;
        if (i == 0 && !options.tools.empty()) out += "\n\n" + tools_text(options.tools);
        break;
      case ChatRole::user:
        out += kUser;
        for (size_t b = 0; b < t.blocks.size(); ++b) {
          if (b) out += "\n\n";
          if (t.blocks[b].tool_result)
            out += "<tool_result>" + t.blocks[b].text + "</tool_result>";
          else
            out += t.blocks[b].text;
        }
        break;
      case ChatRole::assistant: {
        const ChatMessage& m = *t.message;
        // Reasoning is written (closed by </think>) in thinking mode, except for turns
        // before the last user turn when it is dropped; those were prompted with </think>.
        if (thinking && (!drop || !any_user || i > last_user)) {
          out += m.reasoning_content.value_or("");
          out += kThinkEnd;
        }
        out += m.content;
        if (!m.tool_calls.empty()) out += tool_calls_text(m, "messages[" + std::to_string(t.index) + "]");
        out += kEos;
        break;
      }
      case ChatRole::tool:
        break;  // merged into user turns above
    }

    // The assistant header follows a user turn (or a later system turn) unless another
    // non-assistant turn comes next.
    bool next_is_assistant = i + 1 < turns.size() && turns[i + 1].role == ChatRole::assistant;
    bool last = i + 1 == turns.size();
    bool asks = t.role == ChatRole::user || (t.role == ChatRole::system && i > 0);
    if (asks && (next_is_assistant || (last && options.add_generation_prompt))) {
      out += kAssistant;
      out += thinking && (!drop || i >= last_user) ? kThinkStart : kThinkEnd;
    }
  }
  return out;
}

// ---------------------------------------------------------------- messages from JSON

namespace {

// Text a client sent: never the image placeholder, which only an image part may put in a prompt.
const std::string& client_text(const std::string& text, const std::string& where) {
  if (text.find(kImage) != std::string::npos)
    fail(where, "text without " + std::string(kImage) + " (images come as image_url parts)", "the image placeholder");
  return text;
}

// An image part's URL: "image_url": {"url": ...} as OpenAI sends it, or the URL itself.
std::string image_part_url(const ordered_json& part, const std::string& at) {
  auto image = part.find("image_url");
  if (image == part.end()) fail(at + ".image_url", "an object {\"url\": ...}", "nothing");
  if (image->is_string()) return image->get<std::string>();
  if (!image->is_object()) fail(at + ".image_url", "an object {\"url\": ...}", describe(*image));
  auto url = image->find("url");
  if (url == image->end() || !url->is_string() || url->get<std::string>().empty())
    fail(at + ".image_url.url", "a non-empty string", url == image->end() ? "nothing" : describe(*url));
  return url->get<std::string>();
}

// A message's content: a string, or parts joined as the official encoder joins content blocks,
// an image part (where `images` is given: user messages) as the placeholder, its URL into `images`.
std::string text_content(const ordered_json& content, const std::string& where, std::vector<std::string>* images) {
  if (content.is_string()) return client_text(content.get<std::string>(), where);
  const std::string expected = images ? "a string or an array of text and image_url parts" : "a string or an array of text parts";
  if (!content.is_array()) fail(where, expected, describe(content));
  if (content.empty()) fail(where, expected, "an empty array");
  std::string out;
  for (size_t j = 0; j < content.size(); ++j) {
    const ordered_json& part = content[j];
    std::string at = where + "[" + std::to_string(j) + "]";
    if (!part.is_object()) fail(at, "a text part {\"type\": \"text\", \"text\": ...}", describe(part));
    auto type = part.find("type");
    const char* types = images ? "\"text\" or \"image_url\"" : "\"text\"";
    if (type == part.end() || !type->is_string()) fail(at + ".type", types, type == part.end() ? "nothing" : describe(*type));
    if (j) out += "\n\n";
    if (*type == "image_url" && images) {
      images->push_back(image_part_url(part, at));
      out += kImage;
      continue;
    }
    if (*type != "text") {
      if (images) fail(at + ".type", types, describe(*type));
      fail(at + ".type", *type == "image_url" ? "\"text\" (image parts only in user messages)" : "\"text\" (only text parts are supported)",
           describe(*type));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) fail(at + ".text", "a string", text == part.end() ? "nothing" : describe(*text));
    out += client_text(text->get<std::string>(), at + ".text");
  }
  return out;
}

std::string optional_string(const ordered_json& m, const char* key, const std::string& where) {
  auto it = m.find(key);
  if (it == m.end() || it->is_null()) return {};
  if (!it->is_string()) fail(where + "." + key, "a string", describe(*it));
  return it->get<std::string>();
}

ChatToolCall tool_call_from_json(const ordered_json& c, const std::string& where) {
  if (!c.is_object()) fail(where, "a tool call object", describe(c));
  ChatToolCall call;
  call.id = optional_string(c, "id", where);
  auto type = c.find("type");
  if (type != c.end() && *type != "function") fail(where + ".type", "\"function\"", describe(*type));
  auto fn = c.find("function");
  if (fn == c.end() || !fn->is_object()) fail(where + ".function", "an object with name and arguments", fn == c.end() ? "nothing" : describe(*fn));
  auto name = fn->find("name");
  if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
    fail(where + ".function.name", "a non-empty string", name == fn->end() ? "nothing" : describe(*name));
  call.name = name->get<std::string>();
  auto args = fn->find("arguments");
  std::string at = where + ".function.arguments";
  if (args == fn->end()) fail(at, "a JSON object or its text", "nothing");
  if (args->is_object()) {
    call.arguments = args->dump();
  } else if (args->is_string()) {
    const ordered_json parsed = parse_arguments(args->get<std::string>(), at, "the text of a JSON object");
    if (!parsed.is_object()) fail(at, "the text of a JSON object", "the text of " + describe(parsed));
    call.arguments = args->get<std::string>();
  } else {
    fail(at, "a JSON object or its text", describe(*args));
  }
  return call;
}

}  // namespace

std::vector<ChatMessage> chat_messages_from_json(const ordered_json& messages) {
  if (!messages.is_array()) fail("messages", "an array of messages", describe(messages));
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ordered_json& m = messages[i];
    std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) fail(where, "a message object", describe(m));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) fail(where + ".role", "a string", role == m.end() ? "nothing" : describe(*role));
    ChatMessage msg;
    const std::string r = role->get<std::string>();
    // OpenAI's `developer` role is its newer name for system instructions: a system turn here
    // (encoding.py knows no other).
    if (r == "system" || r == "developer") msg.role = ChatRole::system;
    else if (r == "user") msg.role = ChatRole::user;
    else if (r == "assistant") msg.role = ChatRole::assistant;
    else if (r == "tool") msg.role = ChatRole::tool;
    else fail(where + ".role", "one of system, developer, user, assistant, tool", describe(*role));

    auto content = m.find("content");
    bool absent = content == m.end() || content->is_null();
    if (absent && msg.role != ChatRole::assistant)
      fail(where + ".content", "a string or an array of text parts", content == m.end() ? "nothing" : "null");
    if (!absent) msg.content = text_content(*content, where + ".content", msg.role == ChatRole::user ? &msg.image_urls : nullptr);
    msg.name = optional_string(m, "name", where);

    if (msg.role == ChatRole::assistant) {
      auto rc = m.find("reasoning_content");
      if (rc != m.end() && !rc->is_null()) {
        if (!rc->is_string()) fail(where + ".reasoning_content", "a string", describe(*rc));
        msg.reasoning_content = client_text(rc->get<std::string>(), where + ".reasoning_content");
      }
      auto calls = m.find("tool_calls");
      if (calls != m.end() && !calls->is_null()) {
        if (!calls->is_array()) fail(where + ".tool_calls", "an array of tool calls", describe(*calls));
        for (size_t j = 0; j < calls->size(); ++j)
          msg.tool_calls.push_back(tool_call_from_json((*calls)[j], where + ".tool_calls[" + std::to_string(j) + "]"));
      }
    }
    if (msg.role == ChatRole::tool) msg.tool_call_id = optional_string(m, "tool_call_id", where);
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<std::string> chat_image_urls(std::span<const ChatMessage> messages) {
  std::vector<std::string> urls;
  for (const ChatMessage& m : messages) urls.insert(urls.end(), m.image_urls.begin(), m.image_urls.end());
  return urls;
}

std::vector<ordered_json> chat_tools_from_json(const ordered_json& tools) {
  std::vector<ordered_json> out;
  if (tools.is_null()) return out;
  if (!tools.is_array()) fail("tools", "an array of tools", describe(tools));
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) fail(where, "a tool object", describe(t));
    auto type = t.find("type");
    if (type != t.end() && *type != "function") fail(where + ".type", "\"function\"", describe(*type));
    auto fn = t.find("function");
    if (fn == t.end() || !fn->is_object()) fail(where + ".function", "an object", fn == t.end() ? "nothing" : describe(*fn));
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string() || name->get<std::string>().empty())
      fail(where + ".function.name", "a non-empty string", name == fn->end() ? "nothing" : describe(*name));
    out.push_back(*fn);
  }
  return out;
}

int reasoning_effort_from_json(const ordered_json& effort) {
  if (effort.is_null()) return 75;
  if (effort == "low") return 50;
  if (effort == "high") return 75;
  if (effort == "max") return 100;
  if (effort.is_number_integer()) {
    int64_t v = effort.get<int64_t>();
    if (v >= 1 && v <= 100) return static_cast<int>(v);
  }
  fail("reasoning_effort", "\"low\", \"high\", \"max\" or an integer 1..100", describe(effort));
}

std::vector<int> chat_stop_token_ids(const Tokenizer& tokenizer) {
  std::optional<int> eos = tokenizer.token_to_id(kEos);
  if (!eos) fail("tokenizer", "the token " + std::string(kEos), "none");
  return {*eos};
}

// ---------------------------------------------------------------- the reply

namespace {

// The length of the longest suffix of `text` that is a proper prefix of one of `markers`: text
// a later piece could still complete into a marker.
size_t held_back(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t keep = 0;
  for (std::string_view m : markers)
    for (size_t n = std::min(text.size(), m.size() - 1); n > keep; --n)
      if (text.substr(text.size() - n) == m.substr(0, n)) {
        keep = n;
        break;
      }
  return keep;
}

// The first of `markers` in `text`: its position and which one (npos when none).
std::pair<size_t, size_t> find_first(std::string_view text, std::initializer_list<std::string_view> markers) {
  size_t best = std::string_view::npos, which = 0, k = 0;
  for (std::string_view m : markers) {
    size_t p = text.find(m);
    if (p < best) best = p, which = k;
    ++k;
  }
  return {best, which};
}

// Reads `lit` at `pos`, advancing; false when the text has something else there.
bool take(std::string_view text, size_t& pos, std::string_view lit) {
  if (text.substr(pos, lit.size()) != lit) return false;
  pos += lit.size();
  return true;
}

// Reads up to `end` (which is consumed), advancing; nullopt when `end` never comes.
std::optional<std::string_view> take_until(std::string_view text, size_t& pos, std::string_view end) {
  size_t p = text.find(end, pos);
  if (p == std::string_view::npos) return std::nullopt;
  std::string_view got = text.substr(pos, p - pos);
  pos = p + end.size();
  return got;
}

// The body of a tool-call block (between "<｜DSML｜ calls>" and "</｜DSML｜ calls>") as the
// renderer writes it: "\n", invokes separated by "\n", "\n". Arguments are rebuilt as a JSON
// object the way the official parser does: a string="true" value as a JSON string, any other
// value as written (or, when it is not JSON, as a JSON string, so that the result is JSON).
std::optional<std::vector<ParsedToolCall>> parse_calls(std::string_view body) {
  std::vector<ParsedToolCall> calls;
  size_t pos = 0;
  if (!take(body, pos, "\n")) return std::nullopt;
  do {
    if (!take(body, pos, kInvokeOpen)) return std::nullopt;
    auto name = take_until(body, pos, "\">\n");
    if (!name || name->empty()) return std::nullopt;
    std::string args = "{";
    std::vector<std::string_view> keys;
    // An invoke without parameters is written with an empty line before its end tag.
    if (!take(body, pos, "\n" + kInvokeClose)) {
      do {
        if (!take(body, pos, kParamOpen)) return std::nullopt;
        auto key = take_until(body, pos, "\" string=\"");
        if (!key) return std::nullopt;
        bool is_string = take(body, pos, "true\">");
        if (!is_string && !take(body, pos, "false\">")) return std::nullopt;
        auto value = take_until(body, pos, kParamClose);
        if (!value || !take(body, pos, "\n")) return std::nullopt;
        if (std::find(keys.begin(), keys.end(), *key) != keys.end()) return std::nullopt;
        if (!keys.empty()) args += ", ";
        keys.push_back(*key);
        args += json_string(*key) + ": ";
        if (!is_string && ordered_json::accept(*value)) args += *value;
        else args += json_string(*value);
      } while (!take(body, pos, kInvokeClose));
    }
    args += "}";
    calls.push_back(ParsedToolCall{std::string(*name), std::move(args)});
    // Each invoke is followed by a newline: before the next one, or before the block's end.
    if (!take(body, pos, "\n")) return std::nullopt;
  } while (pos < body.size());
  return calls;
}

}  // namespace

ReplyParser::ReplyParser(bool thinking) : state_(thinking ? State::reasoning : State::content) {}

ReplyDelta ReplyParser::push(std::string_view text) {
  ReplyDelta out;
  if (state_ == State::ended) return out;
  pending_ += text;
  run(out, false);
  return out;
}

ReplyDelta ReplyParser::finish() {
  ReplyDelta out;
  if (state_ == State::ended) return out;
  run(out, true);
  // What is left: reasoning or content that only looked like the start of a marker, or a
  // tool-call block that never closed (passed on as the text it is).
  if (state_ == State::reasoning) out.reasoning += pending_;
  else if (state_ == State::content) out.content += pending_;
  else if (state_ == State::tool_calls) out.content += kCallsStart + pending_;
  pending_.clear();
  state_ = State::ended;
  return out;
}

void ReplyParser::run(ReplyDelta& out, bool final) {
  for (;;) {
    std::string_view text = pending_;
    if (state_ == State::reasoning || state_ == State::content) {
      // Reasoning ends at </think>; the answer at a tool-call block. Either ends at EOS.
      std::string_view split = state_ == State::reasoning ? kThinkEnd : std::string_view(kCallsStart);
      std::string& sink = state_ == State::reasoning ? out.reasoning : out.content;
      auto [at, which] = find_first(text, {split, kEos});
      if (at == std::string_view::npos) {
        size_t keep = final ? 0 : held_back(text, {split, kEos});
        sink += text.substr(0, text.size() - keep);
        pending_.erase(0, text.size() - keep);
        return;
      }
      sink += text.substr(0, at);
      if (which == 1) {
        pending_.clear();
        state_ = State::ended;
        return;
      }
      pending_.erase(0, at + split.size());
      state_ = state_ == State::reasoning ? State::content : State::tool_calls;
    } else if (state_ == State::tool_calls) {
      size_t at = text.find(kCallsClose);
      if (at == std::string_view::npos) return;  // a block is passed on only whole
      std::string_view body = text.substr(0, at);
      if (auto calls = parse_calls(body)) {
        for (ParsedToolCall& c : *calls) out.tool_calls.push_back(std::move(c));
      } else {
        out.content += kCallsStart;
        out.content += body;
        out.content += kCallsClose;
      }
      pending_.erase(0, at + kCallsClose.size());
      state_ = State::content;
    } else {
      return;
    }
  }
}

ParsedReply parse_reply(std::string_view text, bool thinking) {
  ReplyParser parser(thinking);
  ParsedReply reply;
  for (const ReplyDelta& d : {parser.push(text), parser.finish()}) {
    reply.reasoning += d.reasoning;
    reply.content += d.content;
    reply.tool_calls.insert(reply.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  }
  return reply;
}

}  // namespace dsv41
