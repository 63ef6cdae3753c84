// The tokenizer's components one at a time, on small hand-made tokenizer.json specs whose right
// answers follow from HF tokenizers' rules; the whole pipeline against transformers.js is in
// tokenizer_oracle_test.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <thread>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/tokenizer/decoders.h"
#include "model/tokenizer/normalizers.h"
#include "model/tokenizer/pre_tokenizers.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "test_util.h"

namespace dsv41 {
namespace {

using nlohmann::json;
using Strings = std::vector<std::string>;

const std::string kTiny = std::string(DSV41_TEST_DATA) + "/tokenizer/v41-tiny.json";

std::string normalize(const json& spec, std::string_view text) { return normalizer_from_json(spec)->normalize(text); }

Strings pre_tokenize(const json& spec, std::string_view text) {
  PreTokenized s{std::string(text), {{0, text.size(), true}}};
  pre_tokenizer_from_json(spec, "test")->pre_tokenize(s);
  Strings out;
  for (const Piece& p : s.pieces) out.push_back(s.text.substr(p.begin, p.end - p.begin));
  return out;
}

Strings decode_chain(const json& spec, Strings tokens) {
  decoder_from_json(spec, "test")->decode_chain(tokens);
  return tokens;
}

// Merges in the ["a", "b"] form (a braced list of pairs would read as a JSON object).
json pairs(std::initializer_list<std::pair<const char*, const char*>> list) {
  json merges = json::array();
  for (const auto& [a, b] : list) merges.push_back(json::array({a, b}));
  return merges;
}

// A character-level BPE over "abcd " and the given merges; more fields can be set by the test.
json tiny_bpe(const json& merges) {
  json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"d", 3}, {" ", 4}, {"ab", 5}, {"bc", 6}, {"abc", 7}, {"cd", 8}, {"abcd", 9}};
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

std::vector<int> encode(const json& tokenizer, std::string_view text, bool add_special = true) {
  return Tokenizer::from_json(tokenizer.dump(), "test").encode(text, add_special);
}

using test::error_of;

// --- Normalizers ---------------------------------------------------------------------------

TEST(Normalizers, UnicodeForms) {
  EXPECT_EQ(normalize({{"type", "NFC"}}, "e\u0301"), "\u00e9");
  EXPECT_EQ(normalize({{"type", "NFD"}}, "\u00e9"), "e\u0301");
  EXPECT_EQ(normalize({{"type", "NFKC"}}, "\ufb01 \u2460 \uff21"), "fi 1 A");
  EXPECT_EQ(normalize({{"type", "NFKD"}}, "\u1e9b\u0323"), "s\u0323\u0307");
  EXPECT_EQ(normalize({{"type", "NFC"}}, "\u212b"), "\u00c5");  // ANGSTROM SIGN is not NFC
}

TEST(Normalizers, LowercaseIsRustsFullMappingWithoutContext) {
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "HeLLo ÀÉ ΣΑΣ"), "hello àé σασ");  // no final sigma
  EXPECT_EQ(normalize({{"type", "Lowercase"}}, "\u0130"), "i\u0307");                // İ -> i + dot above
}

TEST(Normalizers, StripAccentsRemovesEveryMark) {
  json nfkd_strip = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKD"}}, {{"type", "StripAccents"}}}}};
  EXPECT_EQ(normalize(nfkd_strip, "Me llamó"), "Me llamo");
  EXPECT_EQ(normalize(nfkd_strip, "ậ…"), "a...");
  EXPECT_EQ(normalize({{"type", "StripAccents"}}, "e\u0304\u0304\u0304o"), "eo");
  EXPECT_EQ(normalize({{"type", "StripAccents"}}, "\u0915\u093e"), "\u0915");  // Mc (spacing mark) too
  EXPECT_EQ(normalize({{"type", "StripAccents"}}, "这很简单"), "这很简单");
}

TEST(Normalizers, ReplaceStringAndRegex) {
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", "aa"}}}, {"content", "b"}}, "aaaaa"), "bba");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", "[ \\t\\r\\n]+"}}}, {"content", " "}}, "a \t\r\n b\n"),
            "a b ");
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"String", "."}}}, {"content", "!"}}, "a.b"), "a!b");  // literal
  // ^ and $ anchor lines, as in Oniguruma.
  EXPECT_EQ(normalize({{"type", "Replace"}, {"pattern", {{"Regex", "^a|b$"}}}, {"content", "X"}}, "a\nab\nb"), "X\nXX\nX");
}

TEST(Normalizers, PrependStripSequence) {
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "▁"}}, "hi"), "▁hi");
  EXPECT_EQ(normalize({{"type", "Prepend"}, {"prepend", "▁"}}, ""), "");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, "\u3000 a b\t\n\u2003"), "a b");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", false}, {"strip_right", true}}, " a "), " a");
  EXPECT_EQ(normalize({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, "\u200ba"), "\u200ba");  // ZWSP: not White_Space
}

// The chain the Engram code builds (components.md §2.1) from the same function.
TEST(Normalizers, EngramCompressionChain) {
  json spec = {{"type", "Sequence"},
               {"normalizers",
                {{{"type", "NFKC"}},
                 {{"type", "NFD"}},
                 {{"type", "StripAccents"}},
                 {{"type", "Lowercase"}},
                 {{"type", "Replace"}, {"pattern", {{"Regex", "[ \\t\\r\\n]+"}}}, {"content", " "}},
                 {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}}}};
  EXPECT_EQ(normalize(spec, "  Ｃafé\t\tÜBER  \n"), "cafe uber");
  EXPECT_EQ(normalize(spec, "Cụ thể, bạn sẽ"), "cu the, ban se");
  EXPECT_EQ(normalize(spec, "\ufb01\u00bd"), "fi1\u20442");
}

TEST(Normalizers, UnknownTypeIsRefusedByName) {
  std::string msg = error_of([] { normalize({{"type", "BertNormalizer"}}, "x"); });
  EXPECT_NE(msg.find("normalizer type 'BertNormalizer'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NFKC"), std::string::npos) << msg;
}

// --- Pre-tokenizers ------------------------------------------------------------------------

json split(const char* behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
}

TEST(PreTokenizers, SplitBehaviours) {
  const char* text = "the-final--countdown";
  EXPECT_EQ(pre_tokenize(split("Removed"), text), (Strings{"the", "final", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("Isolated"), text), (Strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithPrevious"), text), (Strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pre_tokenize(split("MergedWithNext"), text), (Strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pre_tokenize(split("Contiguous"), text), (Strings{"the", "-", "final", "--", "countdown"}));
}

TEST(PreTokenizers, SplitInvertKeepsTheMatches) {
  json words = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Removed"}, {"invert", true}};
  EXPECT_EQ(pre_tokenize(words, "Hey, man!"), (Strings{"Hey", "man"}));
  EXPECT_EQ(pre_tokenize(split("Removed", true), "a-b"), (Strings{"-"}));
}

TEST(PreTokenizers, RegexIsUnicodeAware) {
  json ws = {{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}};
  // \s is White_Space, as in Oniguruma: U+0085 and U+3000 are, U+FEFF and U+200B are not.
  EXPECT_EQ(pre_tokenize(ws, "a\u0085b\u3000c\ufeffd\u200be"), (Strings{"a", "b", "c\ufeffd\u200be"}));
  json letters = {{"type", "Split"}, {"pattern", {{"Regex", "\\p{L}+"}}}, {"behavior", "Isolated"}};
  EXPECT_EQ(pre_tokenize(letters, "héllo世界42"), (Strings{"héllo世界", "42"}));
  json contraction = {{"type", "Split"}, {"pattern", {{"Regex", "(?i:'s)"}}}, {"behavior", "Isolated"}};
  // Case-insensitive matching folds like Oniguruma's: 'S and 'ſ (long s) both match.
  EXPECT_EQ(pre_tokenize(contraction, "IT'S it'ſ"), (Strings{"IT", "'S", " it", "'ſ"}));
}

TEST(PreTokenizers, BadRegexIsRefused) {
  json bad = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  std::string msg = error_of([&] { pre_tokenize(bad, "x"); });
  EXPECT_NE(msg.find("test.pattern"), std::string::npos) << msg;
}

TEST(PreTokenizers, Digits) {
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", true}}, "ab123c4"),
            (Strings{"ab", "1", "2", "3", "c", "4"}));
  EXPECT_EQ(pre_tokenize({{"type", "Digits"}, {"individual_digits", false}}, "ab123c4"), (Strings{"ab", "123", "c", "4"}));
}

TEST(PreTokenizers, ByteLevel) {
  json gpt2 = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  EXPECT_EQ(pre_tokenize(gpt2, "Hello world's  end\n"), (Strings{"Hello", "Ġworld", "'s", "Ġ", "Ġend", "Ċ"}));
  json prefix = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", false}};
  EXPECT_EQ(pre_tokenize(prefix, "héllo"), (Strings{"ĠhÃ©llo"}));
  EXPECT_EQ(pre_tokenize(prefix, " x"), (Strings{"Ġx"}));
}

TEST(PreTokenizers, Metaspace) {
  json always = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", true}};
  EXPECT_EQ(pre_tokenize(always, "Hey   friend!"), (Strings{"▁Hey", "▁", "▁", "▁friend!"}));
  json no_split = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}, {"split", false}};
  EXPECT_EQ(pre_tokenize(no_split, "a b"), (Strings{"▁a▁b"}));
  // "first": only the piece that starts the input gets the prefix.
  json first = {{"type", "Sequence"},
                {"pretokenizers",
                 {split("Isolated"), {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "first"}}}}};
  EXPECT_EQ(pre_tokenize(first, "a-b"), (Strings{"▁a", "-", "b"}));
  json legacy = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", false}};
  EXPECT_EQ(pre_tokenize(legacy, "a b"), (Strings{"a", "▁b"}));
}

TEST(PreTokenizers, UnknownTypeIsRefusedByName) {
  std::string msg = error_of([] { pre_tokenize({{"type", "Whitespace"}}, "x"); });
  EXPECT_NE(msg.find("pre_tokenizer type 'Whitespace'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("ByteLevel, Split"), std::string::npos) << msg;
  msg = error_of([] { pre_tokenize(split("Sideways"), "x"); });
  EXPECT_NE(msg.find("behavior"), std::string::npos) << msg;
}

// --- BPE model -----------------------------------------------------------------------------

TEST(Bpe, MergesInBothFormsAgree) {
  json pair_form = tiny_bpe(pairs({{"a", "b"}, {"ab", "c"}, {"c", "d"}, {"abc", "d"}}));
  json strings = tiny_bpe(json::array({"a b", "ab c", "c d", "abc d"}));
  for (const char* text : {"abcd", "abc", "dcba", "abab", "cdab"}) EXPECT_EQ(encode(pair_form, text), encode(strings, text));
  EXPECT_EQ(encode(pair_form, "abcd"), (std::vector<int>{9}));
}

TEST(Bpe, LowestRankFirstThenLeftmost) {
  // "b c" outranks "a b": abc -> a bc (no merge "a bc"), not ab c.
  EXPECT_EQ(encode(tiny_bpe(pairs({{"b", "c"}, {"a", "b"}, {"ab", "c"}})), "abc"), (std::vector<int>{0, 6}));
  EXPECT_EQ(encode(tiny_bpe(pairs({{"a", "b"}, {"b", "c"}, {"ab", "c"}})), "abc"), (std::vector<int>{7}));
  // Equal pairs merge from the left: "ababab" -> ab ab ab.
  EXPECT_EQ(encode(tiny_bpe(pairs({{"a", "b"}})), "ababab"), (std::vector<int>{5, 5, 5}));
}

TEST(Bpe, IgnoreMergesTakesVocabularyWordsWhole) {
  json t = tiny_bpe(pairs({{"a", "b"}, {"c", "d"}}));  // no merge reaches "abcd"
  EXPECT_EQ(encode(t, "abcd"), (std::vector<int>{5, 8}));
  t["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode(t, "abcd"), (std::vector<int>{9}));
}

TEST(Bpe, UnknownAndByteFallback) {
  json t = tiny_bpe(pairs({{"a", "b"}}));
  t["model"]["vocab"]["<unk>"] = 10;
  t["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(encode(t, "axyb"), (std::vector<int>{0, 10, 10, 1}));
  t["model"]["fuse_unk"] = true;
  EXPECT_EQ(encode(t, "axyb"), (std::vector<int>{0, 10, 1}));
  t["model"]["vocab"]["<0xC3>"] = 11;
  t["model"]["vocab"]["<0xA9>"] = 12;
  t["model"]["byte_fallback"] = true;
  EXPECT_EQ(encode(t, "é"), (std::vector<int>{11, 12}));
  EXPECT_EQ(encode(t, "éx"), (std::vector<int>{11, 12, 10}));  // no <0x78>: unknown
}

TEST(Bpe, SubwordPrefixAndSuffix) {
  json vocab = {{"a", 0}, {"##b", 1}, {"##c", 2}, {"##bc", 3}, {"a</w>", 4}, {"b", 5}};
  json t = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", pairs({{"##b", "##c"}})}, {"continuing_subword_prefix", "##"}}}};
  EXPECT_EQ(encode(t, "abc"), (std::vector<int>{0, 3}));
  json s = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"end_of_word_suffix", "</w>"}}}};
  EXPECT_EQ(encode(s, "ba"), (std::vector<int>{5, 4}));
}

TEST(Bpe, MalformedModelsAreRefused) {
  json t = tiny_bpe(pairs({{"a", "x"}}));
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find("model.merges[0]"), std::string::npos);
  t = tiny_bpe(json::array());
  t["model"]["dropout"] = 0.1;
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find("dropout"), std::string::npos);
  t = tiny_bpe(json::array());
  t["model"]["type"] = "Unigram";
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find("model type 'Unigram'"), std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json("{\"model\": ", "broken.json"); }).find("broken.json: expected valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json("{}", "empty.json"); }).find("field 'model'"), std::string::npos);
  // A second "model" used to replace the first one's vocabulary silently; deep nesting is refused
  // before anything walks it.
  std::string twice = tiny_bpe(json::array()).dump();
  twice.insert(1, "\"model\": {\"type\": \"BPE\"}, ");
  EXPECT_NE(error_of([&] { Tokenizer::from_json(twice, "twice.json"); }).find("twice.json: expected valid JSON with each key once"),
            std::string::npos);
  // Ids: each once (a second token on id 3 hid the first), below 4 × the entries + 1024 (one id of
  // 2^30 - 1 asked for 32 GiB, ending in bad_alloc with no context).
  t = tiny_bpe(json::array());
  t["model"]["vocab"]["e"] = 3;
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find(".vocab['e']: expected an id no other token has, found id 3, also 'd'"),
            std::string::npos);
  t = tiny_bpe(json::array());
  t["model"]["vocab"]["e"] = (1 << 30) - 1;
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find(".vocab['e']: expected a token id in [0, 1068) (below 4 × the tokens listed"),
            std::string::npos);
  t = tiny_bpe(json::array());
  t["added_tokens"] = json::array({{{"id", 10}, {"content", "<x>"}}, {{"id", 10}, {"content", "<y>"}}});
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find("added_tokens[1].id: expected an id no other added token has, found 10, also '<x>'"),
            std::string::npos);
  t["added_tokens"] = json::array({{{"id", 1 << 29}, {"content", "<x>"}}});
  EXPECT_NE(error_of([&] { encode(t, "a"); }).find("added_tokens[0].id: expected a token id in [0, 1068)"), std::string::npos);
  const std::string deep = "{\"model\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_NE(error_of([&] { Tokenizer::from_json(deep, "deep.json"); }).find("deep.json: expected valid JSON nested at most 64"),
            std::string::npos);
}

// --- Added tokens --------------------------------------------------------------------------

json with_added(json t, json added) {
  t["added_tokens"] = added;
  return t;
}

json added(int id, const char* content, bool special, json flags = json::object()) {
  json a = {{"id", id}, {"content", content}, {"special", special}, {"normalized", !special},
            {"single_word", false}, {"lstrip", false}, {"rstrip", false}};
  a.update(flags);
  return a;
}

TEST(AddedTokens, LeftmostLongestBeforePreTokenization) {
  json t = with_added(tiny_bpe(pairs({{"a", "b"}})), {added(20, "<x>", true), added(21, "<x><y>", true),
                                                 added(22, "b<", false, {{"normalized", false}})});
  // All three are matched on the raw text. "b<" starts first, so it wins over "<x>" (then "x>"
  // has no ids: not in the vocabulary, no unknown token); "<x><y>" is longer than "<x>".
  EXPECT_EQ(encode(t, "ab<x>"), (std::vector<int>{0, 22}));
  EXPECT_EQ(encode(t, "a<x><y>a"), (std::vector<int>{0, 21, 0}));
  EXPECT_EQ(encode(t, "a<x>ab"), (std::vector<int>{0, 20, 5}));
}

TEST(AddedTokens, SingleWordLstripRstrip) {
  json t = tiny_bpe(pairs({{"a", "b"}}));
  t["model"]["vocab"]["<unk>"] = 10;
  t["model"]["unk_token"] = "<unk>";
  t = with_added(t, {added(20, "<m>", false, {{"single_word", true}}), added(21, "<s>", true, {{"lstrip", true}, {"rstrip", true}})});
  EXPECT_EQ(encode(t, "a <m> b"), (std::vector<int>{0, 4, 20, 4, 1}));
  EXPECT_EQ(encode(t, "a<m> b"), (std::vector<int>{0, 10, 10, 10, 4, 1}));  // inside a word: not the token
  EXPECT_EQ(encode(t, "a  <s>  b"), (std::vector<int>{0, 21, 1}));         // spaces on both sides swallowed
}

TEST(AddedTokens, NormalizedTokensMatchNormalizedText) {
  json t = tiny_bpe(pairs({{"a", "b"}}));
  t["normalizer"] = {{"type", "Lowercase"}};
  t = with_added(t, {added(20, "ABC", false), added(21, "DD", true)});  // normalized, and not
  EXPECT_EQ(encode(t, "xAbCx"), encode(t, "xabcx"));
  EXPECT_EQ(encode(t, "AbC"), (std::vector<int>{20}));
  EXPECT_EQ(encode(t, "DD"), (std::vector<int>{21}));
  EXPECT_EQ(encode(t, "dd"), (std::vector<int>{3, 3}));
}

TEST(AddedTokens, DecodeSkipsOnlySpecialOnes) {
  json t = with_added(tiny_bpe(pairs({{"a", "b"}})), {added(20, "<s>", true), added(21, "<t>", false)});
  t["decoder"] = {{"type", "Fuse"}};
  Tokenizer tok = Tokenizer::from_json(t.dump(), "test");
  std::vector<int> ids = tok.encode("<s>ab<t>c");
  EXPECT_EQ(tok.decode(ids), "<s>ab<t>c");
  EXPECT_EQ(tok.decode(ids, true), "ab<t>c");
  EXPECT_TRUE(tok.is_special(20));
  EXPECT_FALSE(tok.is_special(21));
  EXPECT_FALSE(tok.is_special(5));
  EXPECT_EQ(tok.vocab_size(), 22u);
  EXPECT_EQ(tok.token_to_id("<t>"), 21);
  EXPECT_EQ(tok.token_to_id("abcd"), 9);
  EXPECT_EQ(tok.token_to_id("zz"), std::nullopt);
  EXPECT_EQ(tok.id_to_token(20), "<s>");
  EXPECT_NE(error_of([&] { tok.id_to_token(15); }).find("found 15"), std::string::npos);
}

// --- Post-processor and decoders -----------------------------------------------------------

TEST(PostProcessor, TemplateAddsBosAndEos) {
  json t = with_added(tiny_bpe(pairs({{"a", "b"}})), {added(20, "<s>", true), added(21, "</s>", true)});
  t["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                     {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                     {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {20}}, {"tokens", {"<s>"}}}},
                                             {"</s>", {{"id", "</s>"}, {"ids", {21}}, {"tokens", {"</s>"}}}}}}};
  EXPECT_EQ(encode(t, "ab"), (std::vector<int>{20, 5, 21}));
  EXPECT_EQ(encode(t, "ab", false), (std::vector<int>{5}));
  t["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, t["post_processor"]}}};
  EXPECT_EQ(encode(t, "ab"), (std::vector<int>{20, 5, 21}));
  t["post_processor"] = {{"type", "BertProcessing"}};
  EXPECT_NE(error_of([&] { encode(t, "ab"); }).find("post_processor type 'BertProcessing'"), std::string::npos);
}

// A special token's ids are checked as the numbers stored: 2^32 + 20 used to be read as the int 20
// (silently the BOS), 2^64 − 1 as −1.
TEST(PostProcessor, RefusesIdsBeyondInt) {
  json t = with_added(tiny_bpe(pairs({{"a", "b"}})), {added(20, "<s>", true)});
  for (const json& id : {json(4294967316LL), json(18446744073709551615ULL), json(-1)}) {
    t["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
                           {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {id}}, {"tokens", {"<s>"}}}}}}};
    const std::string e = error_of([&] { encode(t, "ab"); });
    EXPECT_NE(e.find("ids in [0, 2^31)"), std::string::npos) << id.dump() << ": " << e;
    EXPECT_NE(e.find(id.dump()), std::string::npos) << e;
  }
}

TEST(Decoders, ByteLevel) {
  json bl = {{"type", "ByteLevel"}};
  EXPECT_EQ(decode_chain(bl, {"Hello", "Ġw", "orld", "Ċ"}), (Strings{"Hello world\n"}));
  EXPECT_EQ(decode_chain(bl, {"Ã", "©"}), (Strings{"é"}));                  // one character over two tokens
  EXPECT_EQ(decode_chain(bl, {"Ã"}), (Strings{"\ufffd"}));                   // half of it
  EXPECT_EQ(decode_chain(bl, {"<｜User｜>", "Ġhi"}), (Strings{"<｜User｜> hi"}));  // not in the alphabet: as is
}

TEST(Decoders, MetaspaceReplaceStripFuseByteFallback) {
  json ms = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", "always"}};
  EXPECT_EQ(decode_chain(ms, {"▁Hey", "▁friend!"}), (Strings{"Hey", " friend!"}));
  ms["prepend_scheme"] = "never";
  EXPECT_EQ(decode_chain(ms, {"▁Hey"}), (Strings{" Hey"}));
  EXPECT_EQ(decode_chain({{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}}, {"▁a▁b"}), (Strings{" a b"}));
  EXPECT_EQ(decode_chain({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 2}}, {"  a   ", " b"}),
            (Strings{" a ", "b"}));
  EXPECT_EQ(decode_chain({{"type", "Fuse"}}, {"a", "b", "c"}), (Strings{"abc"}));
  json bf = {{"type", "ByteFallback"}};
  EXPECT_EQ(decode_chain(bf, {"a", "<0xC3>", "<0xA9>", "b"}), (Strings{"a", "é", "b"}));
  EXPECT_EQ(decode_chain(bf, {"<0xC3>", "x", "<0xE4>", "<0xBD>"}), (Strings{"\ufffd", "x", "\ufffd", "\ufffd"}));
  EXPECT_NE(error_of([] { decode_chain({{"type", "WordPiece"}}, {}); }).find("decoder type 'WordPiece'"), std::string::npos);
}

// --- The fixture's tokenizer, invalid input, streaming, the command ------------------------

TEST(Tokenizer, FixtureVocabulary) {
  Tokenizer tok = Tokenizer::from_file(kTiny);
  EXPECT_EQ(tok.vocab_size(), 600u);
  EXPECT_EQ(tok.id_to_token(0), "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(tok.token_to_id("<｜User｜>"), 512);
  EXPECT_EQ(tok.token_to_id("<｜Assistant｜>"), 513);
  EXPECT_TRUE(tok.is_special(0));
  EXPECT_TRUE(tok.is_special(596));
  EXPECT_FALSE(tok.is_special(100));
  std::vector<int> ids = tok.encode("<｜begin▁of▁sentence｜>Hi<｜User｜>");
  EXPECT_EQ(ids.front(), 0);
  EXPECT_EQ(ids.back(), 512);
  EXPECT_EQ(tok.decode(ids, true), "Hi");
}

TEST(Tokenizer, UnknownIdsDecodeToNothing) {
  Tokenizer tok = Tokenizer::from_file(kTiny);
  std::vector<int> ids = tok.encode("abc");
  std::vector<int> with_holes = {-1, ids[0], 600, 1 << 20};
  with_holes.insert(with_holes.end(), ids.begin() + 1, ids.end());
  EXPECT_EQ(tok.decode(with_holes), "abc");
}

// encode is const and shared: threads encoding at once (sharing the word cache) agree with one
// thread alone.
TEST(Tokenizer, ConcurrentEncodesAgree) {
  Tokenizer tok = Tokenizer::from_file(kTiny);
  std::vector<std::string> lines;
  for (int i = 0; i < 400; ++i)
    lines.push_back("line " + std::to_string(i * 7919) + " héllo wörld " + std::string(size_t(i % 13), '!'));
  Tokenizer alone = Tokenizer::from_file(kTiny);  // its own word cache
  std::vector<std::vector<int>> expected;
  for (const std::string& l : lines) expected.push_back(alone.encode(l));
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = 0; i < lines.size(); ++i) {
        size_t k = (i + size_t(t) * 97) % lines.size();  // each thread starts elsewhere
        if (tok.encode(lines[k]) != expected[k]) ++wrong[size_t(t)];
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(Tokenizer, InvalidUtf8IsReadAsReplacementCharacters) {
  Tokenizer tok = Tokenizer::from_file(kTiny);
  EXPECT_EQ(tok.encode("a\xff" "b"), tok.encode("a\ufffd" "b"));
  EXPECT_EQ(tok.encode("\xe4\xbd"), tok.encode("\ufffd"));          // truncated sequence: one U+FFFD
  EXPECT_EQ(tok.encode("\xed\xa0\x80"), tok.encode("\ufffd\ufffd\ufffd"));  // a surrogate: three
}

TEST(Unicode, RepairIsMaximalSubparts) {
  EXPECT_EQ(unicode::to_valid_utf8("a\xc0\xafz"), "a\ufffd\ufffdz");  // overlong: two bytes, two U+FFFD
  EXPECT_EQ(unicode::to_valid_utf8("\xf0\x9f\x98"), "\ufffd");         // truncated: one
  EXPECT_EQ(unicode::to_valid_utf8("\xf4\x90\x80\x80"), "\ufffd\ufffd\ufffd\ufffd");  // above U+10FFFF
  EXPECT_TRUE(unicode::is_valid_utf8("h\xc3\xa9\xf0\x9f\x98\x80"));
}

TEST(StreamDecoder, HoldsBackHalfCharacters) {
  Tokenizer tok = Tokenizer::from_file(kTiny);
  std::string text = "héllo 😀 世界";
  std::vector<int> ids = tok.encode(text);
  StreamDecoder stream(tok);
  std::string out;
  int held = 0;
  for (int id : ids) {
    std::string piece = stream.push(id);
    EXPECT_TRUE(unicode::is_valid_utf8(piece));
    held += piece.empty();
    out += piece;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
  EXPECT_GT(held, 0);  // the byte-level tiny vocabulary splits these characters over tokens

  // A sequence that ends inside a character: flush gives what decode gives.
  StreamDecoder cut(tok);
  std::string partial;
  for (size_t i = 0; i + 1 < ids.size(); ++i) partial += cut.push(ids[i]);
  partial += cut.flush();
  EXPECT_EQ(partial, tok.decode(std::span<const int>(ids.data(), ids.size() - 1)));
}

TEST(Cli, TokenizePrintsTheIds) {
  Tokenizer tok = Tokenizer::from_file(kTiny);
  std::string cmd = std::string(DSV41_BINARY) + " tokenize --tokenizer " + kTiny + " --ids 'Hello <｜User｜> world'";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
  ASSERT_EQ(::pclose(pipe), 0) << out;
  EXPECT_EQ(json::parse(out).get<std::vector<int>>(), tok.encode("Hello <｜User｜> world"));

  test::TempDir dir("tokenize_cli");
  std::string missing = std::string(DSV41_BINARY) + " tokenize --model " + dir.string() + " x 2>&1";
  pipe = ::popen(missing.c_str(), "r");
  out.clear();
  while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
  EXPECT_NE(::pclose(pipe), 0);
  EXPECT_NE(out.find("tokenizer.json"), std::string::npos) << out;
}

}  // namespace
}  // namespace dsv41
