// init-random --tokenizer DIR: a checkpoint that ships a given Hugging Face tokenizer (the default
// model ships DeepSeek's), with the config fitted to it, and the refusals of tokenizers that do not
// fit. The tokenizer here is the v41-tiny fixture's (600 ids: specials, byte symbols, merges).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/checkpoint.h"
#include "model/config.h"
#include "model/random_checkpoint.h"
#include "model/tokenizer/tokenizer.h"
#include "test_util.h"

using dsv41::test::Outcome;
using dsv41::test::run_dsv41;

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace dsv41;

namespace {

const std::string kFixture = std::string(DSV41_TEST_DATA) + "/fixtures/v41-tiny";

void write_file(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A refusal: a non-zero exit naming the problem, and no checkpoint directory left behind.
void expect_refused(const std::string& args, const test::TempDir& out, const std::string& message) {
  Outcome r = run_dsv41("init-random --preset tiny --out " + out.string() + " " + args);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(out.path())) << "a refused init-random left " << out.string();
}

}  // namespace

TEST(InitRandomTokenizer, ShipsTheTokenizerAndFitsTheConfigToIt) {
  test::TempDir dir("init_random_tokenizer");
  Outcome w = run_dsv41("init-random --preset tiny --quantized --tokenizer " + kFixture + " --out " + dir.string());
  ASSERT_EQ(w.status, 0) << w.output;

  EXPECT_EQ(test::read_text(dir / "tokenizer.json"), test::read_text(kFixture + "/tokenizer.json"));
  EXPECT_EQ(test::read_text(dir / "tokenizer_config.json"), test::read_text(kFixture + "/tokenizer_config.json"));
  const Config c = load_config(dir.string());
  EXPECT_EQ(c.vocab_size, 1024);  // the preset's: the tokenizer's 600 ids, then padding rows
  // The fixture tokenizer's compressed vocabulary (the reference's map has 522 distinct ids),
  // not the 1024-id random tokenizer's.
  EXPECT_EQ(c.engram_compressed_vocab_size, 522);

  // Head rows of the padding ids are zero, those of the tokenizer's ids are not.
  const Checkpoint ckpt = Checkpoint::open(dir.string());
  const TensorView& head = ckpt.get("head.weight");
  const size_t row_bytes = head.nbytes / size_t(c.vocab_size);
  auto zero_rows = [&](int64_t from, int64_t to) {
    for (size_t i = size_t(from) * row_bytes; i < size_t(to) * row_bytes; ++i)
      if (head.data[i] != 0) return false;
    return true;
  };
  EXPECT_TRUE(zero_rows(600, 1024));
  for (int64_t id : {0, 300, 599}) EXPECT_FALSE(zero_rows(id, id + 1)) << "row " << id;
}

TEST(InitRandomTokenizer, TheCheckpointGeneratesThroughItsTokenizer) {
  test::TempDir dir("init_random_tokenizer");
  ASSERT_EQ(run_dsv41("init-random --preset tiny --tokenizer " + kFixture + " --out " + dir.string()).status, 0);
  Outcome g = run_dsv41("generate --model " + dir.string() + " --prompt 'the cat' --max-tokens 12 --json");
  ASSERT_EQ(g.status, 0) << g.output;
  const json j = json::parse(g.output);

  const Tokenizer tok = Tokenizer::from_file(kFixture + "/tokenizer.json");
  EXPECT_EQ(j["prompt_ids"].get<std::vector<int>>(), tok.encode("the cat"));
  const std::vector<int> ids = j["generated_ids"].get<std::vector<int>>();
  ASSERT_FALSE(ids.empty());
  for (int id : ids) EXPECT_LT(id, 600) << "a padding id was emitted";
  EXPECT_EQ(j["text"].get<std::string>(), tok.decode(ids, /*skip_special_tokens=*/true));
}

TEST(InitRandomTokenizer, RefusesATokenizerLargerThanTheVocabulary) {
  test::TempDir out("init_random_tokenizer");
  expect_refused("--tokenizer " + kFixture + " --vocab 512", out, "expected at most vocab_size = 512 ids, found 600 ids");
}

TEST(InitRandomTokenizer, RefusesMissingOrBrokenFiles) {
  test::TempDir out("init_random_tokenizer"), src("init_random_tokenizer_src");
  expect_refused("--tokenizer " + src.string(), out, "no such directory");

  fs::create_directories(src.path());
  write_file(src / "tokenizer.json", test::read_text(kFixture + "/tokenizer.json"));
  expect_refused("--tokenizer " + src.string(), out, "tokenizer_config.json: expected a readable file, found no such file");

  write_file(src / "tokenizer_config.json", "[\"not an object\"]");
  expect_refused("--tokenizer " + src.string(), out, "tokenizer_config.json: expected a JSON object");

  fs::remove(src / "tokenizer.json");
  write_file(src / "tokenizer_config.json", test::read_text(kFixture + "/tokenizer_config.json"));
  expect_refused("--tokenizer " + src.string(), out, "tokenizer.json: expected a readable file, found no such file");
}

// Engram's hasher maps its pad id through the tokenizer: a pad id the tokenizer lacks is refused
// when the config is made, not when the checkpoint is first served.
TEST(InitRandomTokenizer, RefusesAnEngramPadIdOutsideTheTokenizer) {
  Config c = preset("tiny");
  c.engram_pad_id = 700;
  const Tokenizer tok = Tokenizer::from_file(kFixture + "/tokenizer.json");
  try {
    random_checkpoint_config(c, false, tok);
    FAIL() << "accepted engram_pad_id 700 with a 600-id tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("engram_pad_id: expected an id of the tokenizer (below 600), found 700"),
              std::string::npos)
        << e.what();
  }
}
