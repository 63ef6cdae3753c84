// The grammar engine (engine/grammar): the regex and JSON-schema compilers by the strings they
// accept and refuse, the token masks against a brute-force check of every token of a small
// vocabulary, and the termination guarantee of a constraint under adversarial choices.
#include <gtest/gtest.h>

#include <random>

#include "base/error.h"
#include "engine/chat_format.h"
#include "engine/grammar/grammar.h"
#include "engine/grammar/regex.h"
#include "engine/grammar/structured.h"
#include "model/tokenizer/tokenizer.h"
#include "fixture.h"
#include "schema_check.h"

using namespace dsv41;
using namespace dsv41::grammar;
using ojson = nlohmann::ordered_json;

namespace {

// A vocabulary of the 256 single bytes and one special end token (256).
std::shared_ptr<const Vocabulary> byte_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, char(b)));
  bytes.push_back("<end>");
  std::vector<bool> special(257, false);
  special[256] = true;
  return std::make_shared<const Vocabulary>(bytes, special, std::vector<int>{256});
}

// Whether the whole of `text` is one of the automaton's strings.
bool accepts(Grammar& g, std::string_view text) {
  const int s = g.next(g.start(), text);
  return s != Grammar::kDead && g.accepting(s);
}

ByteSet printable() {
  ByteSet s;
  for (int c = 0x20; c < 0x7F; ++c) s.set(size_t(c));
  return s;
}

Grammar regex_grammar(std::string_view pattern) {
  Nfa nfa;
  const Fragment f = Regex::parse(pattern).emit(nfa, printable());
  return Grammar(std::move(nfa), f, byte_vocabulary());
}

Grammar schema_grammar(const std::string& schema) {
  Nfa nfa;
  const Fragment f = json_schema_automaton(nfa, ojson::parse(schema));
  return Grammar(std::move(nfa), f, byte_vocabulary());
}

std::string schema_keyword_refused(const std::string& schema) {
  try {
    Nfa nfa;
    json_schema_automaton(nfa, ojson::parse(schema));
  } catch (const SchemaError& e) {
    return e.keyword;
  }
  return "";
}

}  // namespace

TEST(Regex, AcceptsAndRejects) {
  struct Case {
    const char* pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases{
      {"^[a-z]+$", {"a", "abc"}, {"", "abc1", "A"}},
      {"^\\d{3}-\\d{4}$", {"555-1234"}, {"55-1234", "555-12345", "abc-defg"}},
      {"^(foo|bar)+$", {"foo", "barfoo", "foofoobar"}, {"", "fo", "foob"}},
      {"^a{2,3}$", {"aa", "aaa"}, {"a", "aaaa"}},
      {"^a{2,}b?$", {"aa", "aaaaab"}, {"a", "ab", "aabb"}},
      {"ab", {"ab", "xaby", "xxab"}, {"a", "b", "ba"}},
      {"^[^0-9]*$", {"", "h\xC3\xA9llo", "x y"}, {"a1", "9"}},
      {"^\\w+@\\w+\\.com$", {"me@host.com", "a_1@b.com"}, {"me@host.org", "@host.com", "me@hostxcom"}},
      {"^(?:\\+1 )?\\(\\d{3}\\)$", {"(555)", "+1 (555)"}, {"+1(555)", "(55)"}},
      {"^[A-F0-9-]{4}\\s?[.]x$", {"AB-9.x", "0000 .x"}, {"ab-9.x", "AB-9 x"}},
      {"^caf\xC3\xA9|tea$", {"caf\xC3\xA9", "tea", "caf\xC3\xA9!", "xtea"}, {"cafe", "teas", "xcaf\xC3\xA9"}},
      {"^.$", {"x", "\xE2\x82\xAC"}, {"", "xy", "\xE2\x82"}},
  };
  for (const Case& c : cases) {
    Grammar g = regex_grammar(c.pattern);
    for (const std::string& s : c.yes) EXPECT_TRUE(accepts(g, s)) << c.pattern << " should accept " << s;
    for (const std::string& s : c.no) EXPECT_FALSE(accepts(g, s)) << c.pattern << " should reject " << s;
  }
}

TEST(Regex, RefusesWhatItDoesNotSupportNamingIt) {
  for (const char* p : {"(?=x)", "a\\b", "[\xC3\xA9]", "(ab", "a{3,1}", "a)", "x^", "a**+", "\\1"}) {
    try {
      Regex::parse(p);
      ADD_FAILURE() << p << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("pattern"), std::string::npos) << e.what();
    }
  }
}

TEST(JsonSchema, ObjectsWithRequiredAndOptionalPropertiesInOrder) {
  Grammar g = schema_grammar(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                                  "c": {"type": "boolean"}}, "required": ["b"], "additionalProperties": false})");
  for (const char* yes : {R"({"b":""})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})", R"({"a":-2,"b":"\u00e9\n","c":false})"})
    EXPECT_TRUE(accepts(g, yes)) << yes;
  for (const char* no : {R"({})", R"({"a":1})", R"({"b":"x","a":1})", R"({"b":"x",})", R"({ "b":"x"})", R"({"b":"x","d":1})",
                         R"({"b":"x"}x)"})
    EXPECT_FALSE(accepts(g, no)) << no;
}

TEST(JsonSchema, ArraysEnumsConstsAndNullableTypes) {
  Grammar a = schema_grammar(R"({"type": "array", "items": {"enum": ["red", 2, null]}, "minItems": 1, "maxItems": 3})");
  for (const char* yes : {R"(["red"])", R"([2,null,"red"])"}) EXPECT_TRUE(accepts(a, yes)) << yes;
  for (const char* no : {"[]", R"(["red",2,null,2])", R"(["blue"])", R"([3])"}) EXPECT_FALSE(accepts(a, no)) << no;
  Grammar c = schema_grammar(R"({"const": {"k": [1, "x"]}})");
  EXPECT_TRUE(accepts(c, R"({"k":[1,"x"]})"));
  EXPECT_FALSE(accepts(c, R"({"k":[1]})"));
  Grammar n = schema_grammar(R"({"type": ["string", "null"]})");
  for (const char* yes : {"null", "\"\"", "\"a\""}) EXPECT_TRUE(accepts(n, yes)) << yes;
  EXPECT_FALSE(accepts(n, "1"));
}

TEST(JsonSchema, IntegerRangesExactly) {
  const std::vector<std::pair<std::string, std::pair<int, int>>> ranges{
      {R"({"type": "integer", "minimum": -15, "maximum": 230})", {-15, 230}},
      {R"({"type": "integer", "minimum": 7, "exclusiveMaximum": 100})", {7, 99}},
      {R"({"type": "integer", "exclusiveMinimum": -101, "maximum": -3})", {-100, -3}},
      {R"({"type": "integer", "minimum": 0, "maximum": 0})", {0, 0}},
  };
  for (const auto& [schema, range] : ranges) {
    Grammar g = schema_grammar(schema);
    for (int x = -400; x <= 400; ++x)
      EXPECT_EQ(accepts(g, std::to_string(x)), x >= range.first && x <= range.second) << schema << " at " << x;
    EXPECT_FALSE(accepts(g, "-0"));
    EXPECT_FALSE(accepts(g, "007"));
  }
  Grammar open = schema_grammar(R"({"type": "integer", "minimum": 95})");
  for (const char* yes : {"95", "99", "100", "123456789"}) EXPECT_TRUE(accepts(open, yes)) << yes;
  for (const char* no : {"94", "9", "-100", "0"}) EXPECT_FALSE(accepts(open, no)) << no;
}

TEST(JsonSchema, NumbersStringsAndLengths) {
  Grammar num = schema_grammar(R"({"type": "number"})");
  for (const char* yes : {"0", "-1.5", "3e10", "2.25E-3"}) EXPECT_TRUE(accepts(num, yes)) << yes;
  for (const char* no : {"01", "1.", ".5", "+1", "1e"}) EXPECT_FALSE(accepts(num, no)) << no;
  Grammar len = schema_grammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  for (const char* yes : {"\"ab\"", "\"\xC3\xA9\xC3\xA9\xC3\xA9\"", "\"a\\nb\""}) EXPECT_TRUE(accepts(len, yes)) << yes;
  for (const char* no : {"\"a\"", "\"abcd\"", "\"a\"b\""}) EXPECT_FALSE(accepts(len, no)) << no;
  Grammar pat = schema_grammar(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d+$"})");
  EXPECT_TRUE(accepts(pat, "\"AB-12\""));
  EXPECT_FALSE(accepts(pat, "\"AB-\""));
}

TEST(JsonSchema, AnyOfRefsAndDefs) {
  Grammar g = schema_grammar(R"({"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                                   "required": ["x", "y"], "additionalProperties": false}},
                                   "anyOf": [{"$ref": "#/$defs/point"}, {"type": "array", "items": {"$ref": "#/$defs/point"}}]})");
  for (const char* yes : {R"({"x":1,"y":2})", R"([{"x":1,"y":2},{"x":3,"y":4}])", "[]"}) EXPECT_TRUE(accepts(g, yes)) << yes;
  for (const char* no : {R"({"x":1})", R"([{"y":2,"x":1}])"}) EXPECT_FALSE(accepts(g, no)) << no;
}

TEST(JsonSchema, RefusesKeywordsOutsideTheSubsetNamingThem) {
  EXPECT_EQ(schema_keyword_refused(R"({"type": "string", "format": "date-time"})"), "format");
  EXPECT_EQ(schema_keyword_refused(R"({"type": "number", "minimum": 0})"), "minimum");
  EXPECT_EQ(schema_keyword_refused(R"({"type": "integer", "multipleOf": 3})"), "multipleOf");
  EXPECT_EQ(schema_keyword_refused(R"({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "$ref": "#/$defs/n"})"), "$ref");
  EXPECT_EQ(schema_keyword_refused(R"J({"type": "string", "pattern": "(?=a)"})J"), "pattern");
  EXPECT_EQ(schema_keyword_refused(R"({"type": "object", "patternProperties": {}})"), "patternProperties");
  EXPECT_EQ(schema_keyword_refused(R"({"type": "date"})"), "type");
  EXPECT_EQ(schema_keyword_refused(R"({"type": "object", "properties": {"a": {}}, "required": ["a"]})"), "");
}

// Every token of the fixture's vocabulary, checked one by one against the automaton at each state
// of random walks: allowed exactly when its bytes keep a complete string reachable (an end
// token: when the string is complete; a special token: never), closing when it also shortens
// the distance to complete.
TEST(TokenMask, EqualsABruteForceCheckOfEveryToken) {
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir("v41-tiny") + "/tokenizer.json");
  const int end = *tokenizer.token_to_id(chat_token::kEos);
  auto vocabulary = Vocabulary::from_tokenizer(tokenizer, int64_t(tokenizer.vocab_size()), {end});
  GrammarCache cache(vocabulary);
  const std::vector<std::shared_ptr<Grammar>> grammars{
      cache.json_schema(ojson::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
          "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2}, "n": {"type": "integer", "minimum": -5, "maximum": 40}},
          "required": ["name", "n"]})")),
      cache.json_object(),
      cache.tool_calls({ojson::parse(R"({"name": "get", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                          "required": ["city"]}})")},
                       true),
      cache.no_tool_calls(),
  };
  std::mt19937 rng(7);
  for (const auto& g : grammars) {
    for (int walk = 0; walk < 3; ++walk) {
      int state = g->start();
      for (int step = 0; step < 40; ++step) {
        const auto masks = g->masks(state);
        std::vector<int> allowed;
        for (int t = 0; t < int(vocabulary->size()); ++t) {
          const int to = vocabulary->bytes(t).empty() ? Grammar::kDead : g->next(state, vocabulary->bytes(t));
          const bool expect = t == end ? g->accepting(state) : !vocabulary->special(t) && to != Grammar::kDead;
          ASSERT_EQ(allows(masks->allowed, t), expect) << "token " << t << " at step " << step;
          const bool closer = t == end ? g->accepting(state) : expect && g->distance(to) < g->distance(state);
          ASSERT_EQ(allows(masks->closing, t), closer) << "token " << t << " at step " << step;
          if (expect && t != end) allowed.push_back(t);
        }
        if (allowed.empty()) break;
        state = g->after_token(state, allowed[rng() % allowed.size()]);
      }
    }
  }
  EXPECT_EQ(cache.compiled(), 4u);
  cache.json_object();  // a hit
  EXPECT_EQ(cache.compiled(), 4u);
}

// Whatever the choices among the allowed tokens (here: random ones), a constrained reply ends
// with the end token within max_tokens, and its text is one of the grammar's strings.
TEST(GrammarConstraint, EveryReplyCompletesWithinMaxTokens) {
  const Tokenizer tokenizer = Tokenizer::from_file(test::fixture_dir("v41-tiny") + "/tokenizer.json");
  const int end = *tokenizer.token_to_id(chat_token::kEos);
  auto vocabulary = Vocabulary::from_tokenizer(tokenizer, int64_t(tokenizer.vocab_size()), {end});
  GrammarCache cache(vocabulary);
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]{3,}$"},
      "items": {"type": "array", "items": {"type": "object", "properties": {"v": {"type": "number"}}, "required": ["v"]}}},
      "required": ["id", "items"]})");
  auto g = cache.json_schema(schema);
  std::mt19937 rng(11);
  for (int64_t max_tokens : {int64_t(g->distance(g->start()) + 1), int64_t(30), int64_t(80)}) {
    for (const std::string trigger : {"", "</think>"}) {
      for (int run = 0; run < 10; ++run) {
        const int64_t budget = max_tokens + int64_t(trigger.size());
        GrammarConstraint c(g, budget, trigger);
        std::string text;
        bool ended = false;
        for (int64_t k = 0; k < budget && !ended; ++k) {
          auto mask = c.allowed();
          std::vector<int> options;
          for (int t = 0; t < int(vocabulary->size()); ++t)
            if (mask ? allows(*mask, t) : !vocabulary->special(t) || t == end) options.push_back(t);
          ASSERT_FALSE(options.empty());
          const int t = options[rng() % options.size()];
          c.advance(t);
          if (t == end && c.started()) ended = true;
          else if (t != end) text += vocabulary->bytes(t);
        }
        ASSERT_TRUE(ended) << "no end within " << budget << " tokens: " << text;
        const std::string answer = trigger.empty() ? text : text.substr(text.find(trigger) + trigger.size());
        const ojson value = ojson::parse(answer);
        EXPECT_EQ(test::schema_violation(value, schema, schema), "") << answer;
      }
    }
  }
}
