// Our tokenizer against the independent oracle, transformers.js (@lenml/tokenizers, installed by
// scripts/setup-oracle.sh into tests/oracle/node_modules), on the real tokenizer.json files of
// DeepSeek-V3, Qwen3 and Llama 3, on the v41-tiny fixture's and on a SentencePiece-style one
// (tests/data/tokenizer/spm-tiny.json): identical ids on every line of the King James Bible
// (made at test time with the `bible` command), of the adversarial file
// tests/data/tokenizer/adversarial.jsonl, and of lines made from every added token. Also
// decode(encode(x)) == x on every line where the tokenizer is lossless, and the streaming
// decoder gives the same text as decode.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "test_util.h"
#include "tokenizer_oracle.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kData = fs::path(DSV41_TEST_DATA) / "tokenizer";
using test::kOracle;
using test::oracle_ids;
using test::read_jsonl;

fs::path build_dir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

// The KJV as JSON lines, one verse (or heading) per line, made once per build directory. Written
// under a temporary name and renamed, so that tests running at once never see half a file.
fs::path kjv_corpus() {
  fs::path out = build_dir() / "tokenizer_corpus" / "kjv.jsonl";
  if (fs::exists(out)) return out;
  fs::create_directories(out.parent_path());
  std::string tmp = out.string() + "." + std::to_string(::getpid());
  std::string txt = tmp + ".txt";
  std::string cmd = "COLUMNS=100000 bible -l100000 'gen1:1-rev22:21' > '" + txt + "'";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("`" + cmd + "` failed (Debian package bible-kjv)");
  std::ifstream in(txt);
  std::ofstream o(tmp);
  for (std::string line; std::getline(in, line);) o << json(line).dump() << "\n";
  o.close();
  fs::remove(txt);
  fs::rename(tmp, out);
  return out;
}

// Every added token of a tokenizer.json, alone, inside text, doubled, and cut short by one
// character (text that looks like it but is not), as JSON lines made for this tokenizer.
fs::path added_tokens_corpus(const std::string& name, const fs::path& tokenizer_json) {
  fs::path out = build_dir() / "tokenizer_corpus" / ("added_tokens_" + name + ".jsonl");
  fs::create_directories(out.parent_path());
  json root = json::parse(test::read_text(tokenizer_json));
  std::string tmp = out.string() + "." + std::to_string(::getpid());
  std::ofstream o(tmp);
  for (const json& t : root["added_tokens"]) {
    std::string s = t["content"].get<std::string>();
    size_t cut = s.size() - 1;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    for (const std::string& line : {s, "a " + s + " b", "x" + s + s + "y", s.substr(0, cut), "<" + s.substr(0, cut) + s})
      o << json(line).dump() << "\n";
  }
  o.close();
  fs::rename(tmp, out);
  return out;
}

// What decode(encode(x)) gives back.
enum class RoundTrip {
  Exact,  // x itself
  Nfc,    // x in NFC (the normalizer composes)
  None,   // not checked: SentencePiece-style tokenizers turn "▁" into a space and put a space
          // after every added token
};

struct Case {
  std::string name;       // gtest name
  std::string tokenizer;  // the oracle's name for it
  fs::path json;          // our tokenizer.json
  RoundTrip round_trip;
};

// gtest shows a parameter in test listings: the name, not the struct's bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string tokenizer_path(const std::string& package) {
  return (kOracle / "node_modules" / "@lenml" / ("tokenizer-" + package) / "models" / "tokenizer.json").string();
}

const Case kCases[] = {
    {"deepseek_v3", "deepseek_v3", tokenizer_path("deepseek_v3"), RoundTrip::Exact},
    {"qwen3", "qwen3", tokenizer_path("qwen3"), RoundTrip::Nfc},
    {"llama3", "llama3", tokenizer_path("llama3"), RoundTrip::Exact},
    {"v41_tiny", (kData / "v41-tiny.json").string(), kData / "v41-tiny.json", RoundTrip::Exact},
    // SentencePiece-style (Llama 2 layout): Prepend/Replace normalizer, byte fallback, BOS template.
    {"spm_tiny", (kData / "spm-tiny.json").string(), kData / "spm-tiny.json", RoundTrip::None},
};

std::string show(const std::vector<int>& ids) { return json(ids).dump(); }

// Runs one corpus through both tokenizers, line by line.
void check_corpus(const Case& c, const fs::path& corpus) {
  std::vector<std::string> lines = read_jsonl(corpus);
  ASSERT_FALSE(lines.empty()) << corpus;
  std::vector<std::vector<int>> expected = oracle_ids(c.tokenizer, corpus);
  ASSERT_EQ(expected.size(), lines.size()) << "the oracle answered a different number of lines";
  Tokenizer tok = Tokenizer::from_file(c.json.string());

  int mismatches = 0, not_lossless = 0, stream_mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::vector<int> ids = tok.encode(lines[i]);
    if (ids != expected[i] && ++mismatches <= 5)
      ADD_FAILURE() << c.name << " line " << i + 1 << ": " << json(lines[i]).dump() << "\n  ours:   " << show(ids)
                    << "\n  oracle: " << show(expected[i]);

    // Round trip without the post-processor's BOS/EOS, which are not part of the text.
    std::vector<int> plain = tok.encode(lines[i], false);
    std::string decoded = tok.decode(plain);
    std::string original = c.round_trip == RoundTrip::Nfc ? unicode::normalize(lines[i], unicode::Form::NFC) : lines[i];
    if (c.round_trip != RoundTrip::None && decoded != original && ++not_lossless <= 5)
      ADD_FAILURE() << c.name << " line " << i + 1 << ": decode(encode(x)) != x\n  x:      " << json(original).dump()
                    << "\n  decode: " << json(decoded).dump();

    StreamDecoder stream(tok);
    std::string streamed;
    for (int id : plain) {
      std::string piece = stream.push(id);
      EXPECT_TRUE(unicode::is_valid_utf8(piece));
      streamed += piece;
    }
    streamed += stream.flush();
    if (streamed != decoded && ++stream_mismatches <= 5)
      ADD_FAILURE() << c.name << " line " << i + 1 << ": streamed " << json(streamed).dump() << " != decoded "
                    << json(decoded).dump();
  }
  EXPECT_EQ(mismatches, 0) << "lines whose ids differ from transformers.js, of " << lines.size();
  EXPECT_EQ(not_lossless, 0);
  EXPECT_EQ(stream_mismatches, 0);
  std::printf("%s: %zu lines of %s, ids identical to transformers.js on %zu\n", c.name.c_str(), lines.size(),
              corpus.filename().c_str(), lines.size() - size_t(mismatches));
}

class OracleTest : public testing::TestWithParam<Case> {};

TEST_P(OracleTest, Kjv) { check_corpus(GetParam(), kjv_corpus()); }

TEST_P(OracleTest, Adversarial) { check_corpus(GetParam(), kData / "adversarial.jsonl"); }

TEST_P(OracleTest, AddedTokens) { check_corpus(GetParam(), added_tokens_corpus(GetParam().name, GetParam().json)); }

INSTANTIATE_TEST_SUITE_P(Tokenizers, OracleTest, testing::ValuesIn(kCases),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dsv41
