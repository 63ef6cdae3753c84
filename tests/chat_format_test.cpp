// The chat format (src/engine/chat_format.h) against DeepSeek-V4.1's official encoding.
//
// tests/data/chat/conversations.json pins several conversations: each one's expected prompt was
// written by hand from the official encoder's templates (tests/data/chat/make_cases.py, see
// docs/chat-format.md) and its ids were made from that text by the oracle, transformers.js with
// DeepSeek-V3's real tokenizer.json (installed by scripts/setup-oracle.sh), not by dsv41. Here
// our renderer must give that text and our tokenizer those ids. The rest: the options, the
// errors, and the reply parser, whole and cut into pieces anywhere.
#include "engine/chat_format.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/tokenizer/tokenizer.h"
#include "test_util.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

const fs::path kData = fs::path(DSV41_TEST_DATA) / "chat";
const fs::path kV3Tokenizer = fs::path(DSV41_TEST_DATA).parent_path() / "oracle" / "node_modules" / "@lenml" /
                              "tokenizer-deepseek_v3" / "models" / "tokenizer.json";

const Tokenizer& v3_tokenizer() {
  if (!fs::exists(kV3Tokenizer)) throw std::runtime_error("the oracle is not installed: run scripts/setup-oracle.sh");
  static const Tokenizer tok = Tokenizer::from_file(kV3Tokenizer.string());
  return tok;
}

ChatOptions options_from(const ordered_json& o) {
  ChatOptions options;
  options.thinking = o.at("thinking").get<bool>();
  options.reasoning_effort = reasoning_effort_from_json(o.value("reasoning_effort", ordered_json()));
  options.tools = chat_tools_from_json(o.value("tools", ordered_json()));
  return options;
}

std::string render(const char* messages_json, const ChatOptions& options = {}) {
  return render_chat(chat_messages_from_json(ordered_json::parse(messages_json)), options);
}

const std::string kBos(chat_token::kBos), kEos(chat_token::kEos), kSys(chat_token::kSystem),
    kUser(chat_token::kUser), kAsst(chat_token::kAssistant);
const std::string kEffort75 = "Reasoning Effort: 75 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";

TEST(ChatFormat, PinnedConversationsRenderToTheOracleIds) {
  ordered_json cases = ordered_json::parse(test::read_text(kData / "conversations.json"));
  ASSERT_GE(cases.size(), 8u);
  for (const ordered_json& c : cases) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    std::string text = render_chat(chat_messages_from_json(c.at("messages")), options_from(c.at("options")));
    EXPECT_EQ(text, c.at("text").get<std::string>());
    EXPECT_EQ(v3_tokenizer().encode(text, false), c.at("ids").get<std::vector<int>>());
  }
}

// V4.1's own markers are added tokens of V4.1's tokenizer but not of V3's, where they are plain
// text (several ids); the markers both share are single ids. docs/chat-format.md says why the
// tests still use V3's.
TEST(ChatFormat, V3TokenizerHasTheSharedMarkersButNotV41s) {
  const Tokenizer& tok = v3_tokenizer();
  for (std::string_view m : {chat_token::kBos, chat_token::kEos, chat_token::kUser, chat_token::kAssistant})
    EXPECT_EQ(tok.encode(m, false).size(), 1u) << m;
  for (std::string_view m : {chat_token::kSystem, chat_token::kThinkStart, chat_token::kThinkEnd, chat_token::kDsml})
    EXPECT_GT(tok.encode(m, false).size(), 1u) << m;
  EXPECT_EQ(chat_stop_token_ids(tok), std::vector<int>{1});
}

TEST(ChatFormat, WithoutGenerationPromptTheLastUserTurnEndsThePrompt) {
  ChatOptions options;
  options.thinking = false;
  options.add_generation_prompt = false;
  EXPECT_EQ(render(R"([{"role":"system","content":"S"},{"role":"user","content":"Q"}])", options),
            kBos + kSys + "S" + kUser + "Q");
  // Headers inside the conversation stay: they precede the assistant turns.
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"},{"role":"assistant","content":"A"},{"role":"user","content":"R"}])",
                   options),
            kBos + kUser + "Q" + kAsst + "</think>A" + kEos + kUser + "R");
}

TEST(ChatFormat, KeptThinkingRendersEveryTurnsReasoning) {
  ChatOptions options;
  options.drop_thinking = false;
  EXPECT_EQ(render(R"([{"role":"user","content":"hello"},
                       {"role":"assistant","reasoning_content":"Greeting.","content":"Hi!"},
                       {"role":"user","content":"bye"}])",
                   options),
            kBos + kSys + kEffort75 + kUser + "hello" + kAsst + "<think>Greeting.</think>Hi!" + kEos + kUser + "bye" +
                kAsst + "<think>");
}

TEST(ChatFormat, AFinalAssistantTurnIsClosedAndKeepsItsReasoning) {
  EXPECT_EQ(render(R"([{"role":"user","content":"Q"},{"role":"assistant","reasoning_content":"R","content":"A"}])"),
            kBos + kSys + kEffort75 + kUser + "Q" + kAsst + "<think>R</think>A" + kEos);
}

TEST(ChatFormat, ToolsWithoutASystemMessageGetAnEmptyOne) {
  ChatOptions options;
  options.tools = chat_tools_from_json(ordered_json::parse(R"([{"type":"function","function":{"name":"f"}}])"));
  options.thinking = false;
  std::string chat = render(R"([{"role":"user","content":"Q"}])", options);
  EXPECT_EQ(chat.substr(0, kBos.size() + kSys.size() + 10), kBos + kSys + "\n\n## Tools");
  EXPECT_NE(chat.find("### Available Tool Schemas\n\n{\"name\": \"f\"}\n\nYou MUST"), std::string::npos);
  std::string tail = "invoke tool calls.\n" + kUser + "Q" + kAsst + "</think>";
  EXPECT_EQ(chat.substr(chat.size() - tail.size()), tail);

  options.thinking = true;
  std::string thinking = render(R"([{"role":"user","content":"Q"}])", options);
  EXPECT_EQ(thinking.substr(0, kBos.size() + kSys.size() + kEffort75.size() + 10),
            kBos + kSys + kEffort75 + "\n\n## Tools");
}

TEST(ChatFormat, ReasoningEffortNames) {
  EXPECT_EQ(reasoning_effort_from_json(ordered_json()), 75);
  EXPECT_EQ(reasoning_effort_from_json("low"), 50);
  EXPECT_EQ(reasoning_effort_from_json("high"), 75);
  EXPECT_EQ(reasoning_effort_from_json("max"), 100);
  EXPECT_EQ(reasoning_effort_from_json(1), 1);
  EXPECT_EQ(reasoning_effort_from_json(100), 100);
}

void expect_error(const std::function<void()>& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no error; expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
}

// OpenAI's `developer` role renders as a system turn: the same ids as the conversation with
// `system` in its place.
TEST(ChatFormat, DeveloperIsASystemTurn) {
  for (const char* tail : {R"([{"role":"X","content":"be brief"},{"role":"user","content":"hi"}])",
                           R"([{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"X","content":"now in French"},{"role":"user","content":"hi"}])"}) {
    std::string developer = tail, system = tail;
    developer.replace(developer.find("\"X\""), 3, "\"developer\"");
    system.replace(system.find("\"X\""), 3, "\"system\"");
    const std::vector<ChatMessage> d = chat_messages_from_json(ordered_json::parse(developer));
    const std::vector<ChatMessage> s = chat_messages_from_json(ordered_json::parse(system));
    ASSERT_EQ(d.size(), s.size());
    for (size_t i = 0; i < d.size(); ++i) {
      EXPECT_EQ(d[i].role, s[i].role) << tail;
      EXPECT_EQ(d[i].content, s[i].content) << tail;
    }
  }
}

TEST(ChatFormat, ErrorsNameTheFieldWhatWasExpectedAndWhatWasFound) {
  auto messages = [](const char* s) { return [s] { chat_messages_from_json(ordered_json::parse(s)); }; };
  expect_error(messages(R"({"role":"user"})"), "messages: expected an array of messages, found an object");
  expect_error(messages(R"([{"role":"user","content":"a"},{"role":"critic","content":"b"}])"),
               R"(messages[1].role: expected one of system, developer, user, assistant, tool, found "critic")");
  expect_error(messages(R"([{"content":"a"}])"), "messages[0].role: expected a string, found nothing");
  expect_error(messages(R"([{"role":"user","content":5}])"),
               "messages[0].content: expected a string or an array of text and image_url parts, found number 5");
  expect_error(messages(R"([{"role":"system","content":5}])"),
               "messages[0].content: expected a string or an array of text parts, found number 5");
  expect_error(messages(R"([{"role":"user","content":null}])"),
               "messages[0].content: expected a string or an array of text parts, found null");
  expect_error(messages(R"([{"role":"user","content":[]}])"),
               "messages[0].content: expected a string or an array of text and image_url parts, found an empty array");
  expect_error(messages(R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_audio"}]}])"),
               R"(messages[0].content[1].type: expected "text" or "image_url", found "input_audio")");
  expect_error(messages(R"([{"role":"system","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}])"),
               R"(messages[0].content[1].type: expected "text" (image parts only in user messages), found "image_url")");
  expect_error(messages(R"([{"role":"tool","content":[{"type":"audio"}]}])"),
               R"(messages[0].content[0].type: expected "text" (only text parts are supported), found "audio")");
  expect_error(messages(R"([{"role":"user","content":[{"type":"image_url"}]}])"),
               R"(messages[0].content[0].image_url: expected an object {"url": ...}, found nothing)");
  expect_error(messages(R"([{"role":"user","content":[{"type":"image_url","image_url":{"detail":"low"}}]}])"),
               "messages[0].content[0].image_url.url: expected a non-empty string, found nothing");
  // The placeholder is the image parts' alone (encoding.py refuses it in text too).
  expect_error(messages(R"([{"role":"user","content":"look: <｜deepseek_image｜>"}])"),
               "messages[0].content: expected text without <｜deepseek_image｜> (images come as image_url parts), found the image placeholder");
  expect_error(messages(R"([{"role":"user","content":[{"type":"text","text":"<｜deepseek_image｜>"}]}])"),
               "messages[0].content[0].text: expected text without <｜deepseek_image｜> (images come as image_url parts), found the image placeholder");
  expect_error(messages(R"([{"role":"assistant","content":"a","reasoning_content":"<｜deepseek_image｜>"}])"),
               "messages[0].reasoning_content: expected text without <｜deepseek_image｜> (images come as image_url parts), found the image placeholder");
  expect_error(messages(R"([{"role":"user","content":[{"type":"text"}]}])"),
               "messages[0].content[0].text: expected a string, found nothing");
  expect_error(messages(R"([{"role":"assistant","content":"a","reasoning_content":1}])"),
               "messages[0].reasoning_content: expected a string, found number 1");
  expect_error(messages(R"([{"role":"assistant","content":null,"tool_calls":{}}])"),
               "messages[0].tool_calls: expected an array of tool calls, found an object");
  expect_error(messages(R"([{"role":"assistant","tool_calls":[{"function":{"arguments":"{}"}}]}])"),
               "messages[0].tool_calls[0].function.name: expected a non-empty string, found nothing");
  expect_error(messages(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{oops"}}]}])"),
               R"(messages[0].tool_calls[0].function.arguments: expected the text of a JSON object, found text that is not JSON: "{oops")");
  // Quoted to 40 bytes, which here cut a three-byte character: the quote shows U+FFFD there (it
  // threw out of the error path and aborted, request_fuzz found).
  expect_error(messages(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{\"OOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOO\u7777 x"}}]}])"),
               "messages[0].tool_calls[0].function.arguments: expected the text of a JSON object, found text that is not JSON: "
               "\"{\\\"OOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOOO\xef\xbf\xbd\"");
  expect_error(messages(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}])"),
               "messages[0].tool_calls[0].function.arguments: expected the text of a JSON object, found the text of an array");
  expect_error(messages(R"([{"role":"tool","content":"r","tool_call_id":7}])"),
               "messages[0].tool_call_id: expected a string, found number 7");

  expect_error([] { chat_tools_from_json(ordered_json::parse(R"({"type":"function"})")); },
               "tools: expected an array of tools, found an object");
  expect_error([] { chat_tools_from_json(ordered_json::parse(R"([{"type":"function","function":{}}])")); },
               "tools[0].function.name: expected a non-empty string, found nothing");
  expect_error([] { chat_tools_from_json(ordered_json::parse(R"([{"type":"retrieval"}])")); },
               R"(tools[0].type: expected "function", found "retrieval")");
  expect_error([] { reasoning_effort_from_json("medium"); },
               R"(reasoning_effort: expected "low", "high", "max" or an integer 1..100, found "medium")");
  expect_error([] { reasoning_effort_from_json(101); },
               R"(reasoning_effort: expected "low", "high", "max" or an integer 1..100, found number 101)");

  expect_error([] { render_chat({}, {}); }, "messages: expected at least one message, found none");
  ChatOptions bad;
  bad.reasoning_effort = 0;
  expect_error([&] { render("[{\"role\":\"user\",\"content\":\"q\"}]", bad); },
               "reasoning_effort: expected an integer 1..100, found 0");
  // Messages built in code are checked when rendered.
  std::vector<ChatMessage> built(2);
  built[1].role = ChatRole::assistant;
  built[1].tool_calls.push_back({"id", "f", "not json"});
  expect_error([&] { render_chat(built, {}); },
               R"(messages[1].tool_calls[0].function.arguments: expected a JSON object, found text that is not JSON: "not json")");
  // Arguments nested 100,000 deep inside a 200 KB string (the body's own depth bound does not see
  // into strings): refused when read and when rendered, not recursed into until the stack ends.
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_error([&] {
    ordered_json m = ordered_json::parse(R"([{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}])");
    m[0]["tool_calls"][0]["function"]["arguments"] = deep;
    chat_messages_from_json(m);
  }, "messages[0].tool_calls[0].function.arguments: expected the text of a JSON object nested at most 128 levels deep, found deeper nesting");
  built[1].tool_calls[0].arguments = deep;
  expect_error([&] { render_chat(built, {}); },
               "messages[1].tool_calls[0].function.arguments: expected a JSON object nested at most 128 levels deep, found deeper nesting");
  // A number out of double's range inside the arguments text is text that is not JSON.
  built[1].tool_calls[0].arguments = R"({"x": 1e400})";
  expect_error([&] { render_chat(built, {}); },
               R"(messages[1].tool_calls[0].function.arguments: expected a JSON object, found text that is not JSON: "{\"x\": 1e400}")");
}

// Image parts (user messages) become the placeholder where they stand, joined to the other parts
// as content blocks are (encoding.py's _process_image_blocks); their URLs come out in prompt order.
TEST(ChatFormat, ImagePartsArePlaceholdersInPlace) {
  const std::vector<ChatMessage> messages = chat_messages_from_json(ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:a"}}]},
    {"role": "assistant", "content": "A cat."},
    {"role": "user", "content": [{"type": "image_url", "image_url": "data:b"}, {"type": "image_url", "image_url": {"url": "data:c", "detail": "high"}}, {"type": "text", "text": "And these?"}]}
  ])"));
  ChatOptions options;
  options.thinking = false;
  EXPECT_EQ(render_chat(messages, options),
            "<｜begin▁of▁sentence｜><｜System｜>Be brief.<｜User｜>What is this?\n\n<｜deepseek_image｜><｜Assistant｜></think>A cat."
            "<｜end▁of▁sentence｜><｜User｜><｜deepseek_image｜>\n\n<｜deepseek_image｜>\n\nAnd these?<｜Assistant｜></think>");
  EXPECT_EQ(chat_image_urls(messages), (std::vector<std::string>{"data:a", "data:b", "data:c"}));
}

// ---------------------------------------------------------------- the reply

const std::string kToolReply =
    "Need data.</think>Checking.\n\n<｜DSML｜ calls>\n"
    "<｜DSML｜ invoke name=\"get_weather\">\n"
    "<｜DSML｜ parameter name=\"city\" string=\"true\">Paris</｜DSML｜ parameter>\n"
    "<｜DSML｜ parameter name=\"days\" string=\"false\">3</｜DSML｜ parameter>\n"
    "</｜DSML｜ invoke>\n"
    "<｜DSML｜ invoke name=\"get_time\">\n\n</｜DSML｜ invoke>\n"
    "</｜DSML｜ calls><｜end▁of▁sentence｜>";

void expect_tool_reply(const ParsedReply& r) {
  EXPECT_EQ(r.reasoning, "Need data.");
  EXPECT_EQ(r.content, "Checking.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Paris", "days": 3})");
  EXPECT_EQ(r.tool_calls[1].name, "get_time");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

TEST(ReplyParser, WholeReplies) {
  ParsedReply r = parse_reply("Simple arithmetic.</think>2 + 2 = 4.<｜end▁of▁sentence｜>", true);
  EXPECT_EQ(r.reasoning, "Simple arithmetic.");
  EXPECT_EQ(r.content, "2 + 2 = 4.");
  EXPECT_TRUE(r.tool_calls.empty());

  r = parse_reply("Hello</think> there<｜end▁of▁sentence｜>ignored", false);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hello</think> there");

  expect_tool_reply(parse_reply(kToolReply, true));

  // Cut short by the token limit: all of it is reasoning.
  r = parse_reply("Still thinking about </thi", true);
  EXPECT_EQ(r.reasoning, "Still thinking about </thi");
  EXPECT_EQ(r.content, "");
}

// A block that does not parse, or never closes, reaches the client as the text it is.
TEST(ReplyParser, MalformedToolBlocksPassThroughAsContent) {
  std::string bad = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\nno parameter here\n</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  ParsedReply r = parse_reply("A" + bad + "<｜end▁of▁sentence｜>", false);
  EXPECT_EQ(r.content, "A" + bad);
  EXPECT_TRUE(r.tool_calls.empty());

  std::string open = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n";
  r = parse_reply("B" + open, false);
  EXPECT_EQ(r.content, "B" + open);
  EXPECT_TRUE(r.tool_calls.empty());

  // A duplicate parameter name is malformed too (the official parser refuses it).
  std::string dup = "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
                    "<｜DSML｜ parameter name=\"a\" string=\"true\">1</｜DSML｜ parameter>\n"
                    "<｜DSML｜ parameter name=\"a\" string=\"true\">2</｜DSML｜ parameter>\n"
                    "</｜DSML｜ invoke>\n</｜DSML｜ calls>";
  r = parse_reply(dup, false);
  EXPECT_EQ(r.content, dup);
  EXPECT_TRUE(r.tool_calls.empty());
}

TEST(ReplyParser, ArgumentsAreAlwaysJson) {
  ParsedReply r = parse_reply(
      "\n\n<｜DSML｜ calls>\n<｜DSML｜ invoke name=\"f\">\n"
      "<｜DSML｜ parameter name=\"q\" string=\"true\">say \"hi\"\n</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"n\" string=\"false\">[1, {\"x\": null}]</｜DSML｜ parameter>\n"
      "<｜DSML｜ parameter name=\"bad\" string=\"false\">not json</｜DSML｜ parameter>\n"
      "</｜DSML｜ invoke>\n</｜DSML｜ calls>",
      false);
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"q": "say \"hi\"\n", "n": [1, {"x": null}], "bad": "not json"})");
}

// What the renderer writes for an assistant's tool calls parses back to the same calls.
TEST(ReplyParser, ParsesWhatTheRendererWrites) {
  ChatOptions options;
  options.thinking = false;
  std::string prompt = render(R"([{"role":"user","content":"Q"},
      {"role":"assistant","content":"Let me see.","tool_calls":[
        {"id":"1","type":"function","function":{"name":"search","arguments":"{\"q\":\"a </think> b\",\"k\":5,\"f\":{\"deep\":[true,1.5]}}"}},
        {"id":"2","type":"function","function":{"name":"noop","arguments":"{}"}}]}])",
                              options);
  std::string reply = prompt.substr(prompt.find("</think>") + 8);
  ParsedReply r = parse_reply(reply, false);
  EXPECT_EQ(r.content, "Let me see.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].name, "search");
  EXPECT_EQ(ordered_json::parse(r.tool_calls[0].arguments),
            ordered_json::parse(R"({"q":"a </think> b","k":5,"f":{"deep":[true,1.5]}})"));
  EXPECT_EQ(r.tool_calls[1].name, "noop");
  EXPECT_EQ(r.tool_calls[1].arguments, "{}");
}

ParsedReply parse_in_pieces(std::string_view text, bool thinking, const std::vector<size_t>& cuts) {
  ReplyParser parser(thinking);
  ParsedReply r;
  auto add = [&](const ReplyDelta& d) {
    r.reasoning += d.reasoning;
    r.content += d.content;
    r.tool_calls.insert(r.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  size_t from = 0;
  for (size_t cut : cuts) {
    add(parser.push(text.substr(from, cut - from)));
    from = cut;
  }
  add(parser.push(text.substr(from)));
  add(parser.finish());
  return r;
}

TEST(ReplyParser, AnyCuttingGivesTheSameReply) {
  for (size_t cut = 0; cut <= kToolReply.size(); ++cut) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    expect_tool_reply(parse_in_pieces(kToolReply, true, {cut}));
  }
  std::vector<size_t> every_byte;
  for (size_t i = 1; i < kToolReply.size(); ++i) every_byte.push_back(i);
  expect_tool_reply(parse_in_pieces(kToolReply, true, every_byte));
}

// Text goes out as soon as no marker can begin in it; only a possible marker start waits.
TEST(ReplyParser, StreamsWithoutWaitingLongerThanAMarker) {
  ReplyParser p(true);
  ReplyDelta d = p.push("Let me think");
  EXPECT_EQ(d.reasoning, "Let me think");
  d = p.push(" more.</th");
  EXPECT_EQ(d.reasoning, " more.");
  d = p.push("ink>The answer");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "The answer");
  d = p.push(" is 4.\n");
  EXPECT_EQ(d.content, " is 4.");
  d = p.push("\nMore");  // a blank line that does not open a tool-call block
  EXPECT_EQ(d.content, "\n\nMore");
  d = p.push("<｜end▁of");
  EXPECT_TRUE(d.empty());
  EXPECT_FALSE(p.ended());
  d = p.push("▁sentence｜>trailing");
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(p.ended());
  EXPECT_TRUE(p.push("after the end").empty());
  EXPECT_TRUE(p.finish().empty());
}

}  // namespace
}  // namespace dsv41
