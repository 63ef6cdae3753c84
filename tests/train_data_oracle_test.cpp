// The tokenizer the project trains, read by transformers.js (the oracle of
// tokenizer_oracle_test.cpp) and by dsv41's Tokenizer: trained here on the train split of two
// installed sources, it must give identical ids on held-out text — the validation split's
// lines, tests/data/tokenizer/adversarial.jsonl, and lines with the chat markers.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/tokenizer/tokenizer.h"
#include "test_util.h"
#include "tokenizer_oracle.h"
#include "train/data/bpe_trainer.h"
#include "train/data/corpus.h"
#include "train/data/tokenizer_json.h"

namespace dsv41::train {
namespace {

namespace fs = std::filesystem;

TEST(TrainDataOracle, TransformersJsGivesTheSameIds) {
  CorpusOptions options;
  options.validation_fraction = 0.1;
  const Corpus corpus = build_corpus(select_sources({"jargon", "devil"}), options);
  WordCounter counter;
  for (const Document& d : corpus.train) counter.add(d.text);
  BpeOptions bpe;
  bpe.symbols = 4096 - kAddedTokens.size();
  const std::string json = tokenizer_json(train_bpe(counter.words(), bpe));

  test::TempDir dir("trained_tokenizer");
  fs::create_directories(dir.path());
  std::ofstream(dir / "tokenizer.json") << json;
  std::vector<std::string> lines;
  for (const Document& d : corpus.validation) {
    std::string text = d.text;
    for (size_t pos = 0, eol; pos < text.size(); pos = eol + 1) {
      eol = text.find('\n', pos);
      if (eol == std::string::npos) eol = text.size();
      if (eol > pos) lines.push_back(text.substr(pos, eol - pos));
    }
    lines.push_back(text);  // whole documents too: newlines inside
  }
  for (const std::string& l : test::read_jsonl(fs::path(DSV41_TEST_DATA) / "tokenizer" / "adversarial.jsonl")) lines.push_back(l);
  for (const AddedToken& t : kAddedTokens) {
    const std::string m(t.content);
    size_t cut = m.size() - 1;  // the marker less its last character
    while (cut > 0 && (static_cast<unsigned char>(m[cut]) & 0xC0) == 0x80) --cut;
    for (const std::string& l : {m, "a " + m + " b", "x" + m + m + "y", m.substr(0, cut)}) lines.push_back(l);
  }
  lines.push_back("<｜begin▁of▁sentence｜><｜System｜>Be brief.<｜User｜>Hello<｜Assistant｜><think>Hm.</think>Hi.<｜end▁of▁sentence｜>");
  {
    std::ofstream out(dir / "held_out.jsonl");
    for (const std::string& l : lines) out << nlohmann::json(l).dump() << "\n";
  }
  ASSERT_GT(corpus.validation.size(), 10u);

  const std::vector<std::vector<int>> expected = test::oracle_ids((dir / "tokenizer.json").string(), dir / "held_out.jsonl");
  ASSERT_EQ(expected.size(), lines.size()) << "the oracle answered a different number of lines";
  const Tokenizer tok = Tokenizer::from_json(json, "trained");
  int mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::vector<int> ids = tok.encode(lines[i]);
    if (ids != expected[i] && ++mismatches <= 5)
      ADD_FAILURE() << "line " << i + 1 << ": " << nlohmann::json(lines[i]).dump() << "\n  ours:   " << nlohmann::json(ids).dump()
                    << "\n  oracle: " << nlohmann::json(expected[i]).dump();
  }
  EXPECT_EQ(mismatches, 0) << "of " << lines.size() << " lines";
  std::printf("%zu held-out lines: ids identical to transformers.js on %zu\n", lines.size(), lines.size() - size_t(mismatches));
}

}  // namespace
}  // namespace dsv41::train
