// `dsv41 data build` end to end on one small installed source (The Devil's Dictionary): the
// files it writes, its summary against what the files hold, the packed tokens decoding back to
// the documents, and a second build giving byte-identical tokenizer and token files.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "test_util.h"
#include "train/data/corpus.h"
#include "train/data/packed_tokens.h"

namespace dsv41::train {
namespace {

namespace fs = std::filesystem;

TEST(TrainDataBuild, TheCommandWritesEveryFileAndTheSummaryMatchesThem) {
  test::TempDir a("data_build_a"), b("data_build_b");
  const test::Outcome out = test::run_dsv41("data build --sources devil --vocab 1024 --json --out " + a.string());
  ASSERT_EQ(out.status, 0) << out.output;
  EXPECT_EQ(out.output.find('\r'), std::string::npos) << "no progress bar when stderr is not a terminal";
  const nlohmann::json summary = nlohmann::json::parse(out.output);
  EXPECT_EQ(summary, nlohmann::json::parse(test::read_text(a / "summary.json")));
  for (const char* f : {"train.jsonl", "validation.jsonl", "tokenizer.json", "tokenizer_config.json", "train.tokens",
                        "validation.tokens", "summary.json", "NOTICE"})
    EXPECT_TRUE(fs::exists(a / f)) << f;

  // devil.index: 1,008 headwords, 5 about the file, 4 sharing an entry: 999 documents.
  const nlohmann::json& devil = summary["sources"][0];
  EXPECT_EQ(devil["name"], "devil");
  EXPECT_EQ(devil["documents"], 999);
  EXPECT_EQ(devil["empty"].get<int>() + devil["exact_duplicates"].get<int>() + devil["near_duplicates"].get<int>() +
                devil["train_documents"].get<int>() + devil["validation_documents"].get<int>(),
            999);
  EXPECT_EQ(summary["vocab_size"], 1024);

  const std::vector<Document> train = read_documents((a / "train.jsonl").string());
  const std::vector<Document> validation = read_documents((a / "validation.jsonl").string());
  EXPECT_EQ(summary["train"]["documents"], train.size());
  EXPECT_EQ(summary["validation"]["documents"], validation.size());
  EXPECT_GT(validation.size(), 0u);

  // The train tokens: each document as BOS, its tokens, EOS; decoded, the documents' text.
  const Tokenizer tok = Tokenizer::from_file((a / "tokenizer.json").string());
  const PackedTokens tokens = PackedTokens::read((a / "train.tokens").string());
  EXPECT_EQ(tokens.documents(), train.size());
  EXPECT_EQ(summary["train"]["tokens"], tokens.size());
  EXPECT_EQ(tokens.vocab_size(), tok.vocab_size());
  size_t doc = 0, start = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens.tokens()[i] != 1) continue;
    ASSERT_LT(doc, train.size());
    ASSERT_EQ(tokens.tokens()[start], 0u) << "document " << doc << " starts with BOS";
    const std::vector<int> ids(tokens.tokens().begin() + long(start) + 1, tokens.tokens().begin() + long(i));
    ASSERT_EQ(tok.decode(ids), train[doc].text) << train[doc].key;
    ++doc;
    start = i + 1;
  }
  EXPECT_EQ(doc, train.size());
  EXPECT_EQ(start, tokens.size());

  // Deterministic: the same corpus gives the same bytes.
  ASSERT_EQ(test::run_dsv41("data build --sources devil --vocab 1024 --out " + b.string()).status, 0);
  for (const char* f : {"train.jsonl", "validation.jsonl", "tokenizer.json", "tokenizer_config.json", "train.tokens", "validation.tokens"})
    EXPECT_EQ(test::read_text(a / f), test::read_text(b / f)) << f;
}

TEST(TrainDataBuild, BadOptionsAreRefusedByName) {
  test::TempDir dir("data_build_bad");
  const test::Outcome unknown = test::run_dsv41("data build --sources devil,fortunes --out " + dir.string());
  EXPECT_EQ(unknown.status, 1);
  EXPECT_NE(unknown.output.find("source \"fortunes\": expected one of kjv, austen, jargon, devil, wordnet, found \"fortunes\""),
            std::string::npos)
      << unknown.output;
  EXPECT_NE(test::run_dsv41("data build --vocab 100 --out " + dir.string()).status, 0);
  EXPECT_NE(test::run_dsv41("data build").status, 0);  // --out is required
}

}  // namespace
}  // namespace dsv41::train
