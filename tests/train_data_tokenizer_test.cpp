// The project's BPE tokenizer (src/train/data/bpe_trainer.h, tokenizer_json.h): merges on a tiny
// corpus derived by hand in the comments, word counting through DeepSeek's pre-tokenizer, the
// layout of tokenizer.json as dsv41's Tokenizer reads it (ids, added tokens, the chat markers as
// single ids), decode(encode(x)) == x for arbitrary text, and deterministic training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>

#include "engine/chat_format.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "test_util.h"
#include "train/data/bpe_trainer.h"
#include "train/data/tokenizer_json.h"

namespace dsv41::train {
namespace {

// The classic example: words hug 10, pug 5, pun 12, bun 4, hugs 5. Pair counts, merge by merge
// (the highest count first; a tie goes to the smaller (left, right) symbol ids):
//   u g 20 (hug, pug, hugs)   u n 16   p u 17 -> after "ug": p u 12 only   h u 15 -> h ug 15
//   1. u+g  = ug   (256)  counts: h ug 15, p ug 5, p u 12, u n 16, b u 4, ug s 5
//   2. u+n  = un   (257)  counts: h ug 15, p ug 5, p un 12, b un 4, ug s 5
//   3. h+ug = hug  (258)  counts: p ug 5, p un 12, b un 4, hug s 5
//   4. p+un = pun  (259)  counts: p ug 5, b un 4, hug s 5
//   5. p+ug = pug  (260)  the tie p ug 5 / hug s 5: (112, 256) < (258, 115)
//   6. hug+s = hugs (261)
//   7. b+un = bun  (262)  and every word is one symbol: training stops.
const std::vector<std::pair<std::string, uint64_t>> kHugWords = {{"bun", 4}, {"hug", 10}, {"hugs", 5}, {"pug", 5}, {"pun", 12}};

std::vector<std::string> merge_texts(const BpeModel& m) {
  std::vector<std::string> out;
  for (const BpeModel::Merge& x : m.merges)
    out.push_back(m.symbols[size_t(x.left)] + "+" + m.symbols[size_t(x.right)] + "=" + m.symbols[size_t(x.result)]);
  return out;
}

TEST(TrainDataTokenizer, MergesOfATinyCorpusAsDerivedByHand) {
  BpeOptions options;
  options.symbols = 1000;
  const BpeModel m = train_bpe(kHugWords, options);
  EXPECT_EQ(merge_texts(m), (std::vector<std::string>{"u+g=ug", "u+n=un", "h+ug=hug", "p+un=pun", "p+ug=pug", "hug+s=hugs",
                                                      "b+un=bun"}));
  ASSERT_EQ(m.symbols.size(), 263u);
  EXPECT_EQ(m.merges[4].result, 260);
  EXPECT_EQ(m.symbols[262], "bun");

  // The vocabulary's size stops training: 259 symbols are 3 merges.
  options.symbols = 259;
  EXPECT_EQ(merge_texts(train_bpe(kHugWords, options)), (std::vector<std::string>{"u+g=ug", "u+n=un", "h+ug=hug"}));
  // So does a pair count under min_count: after pun (12) the best pair occurs 5 times.
  options.symbols = 1000;
  options.min_count = 6;
  EXPECT_EQ(train_bpe(kHugWords, options).merges.size(), 4u);
}

TEST(TrainDataTokenizer, EncodingWithTheTrainedMergesFollowsTheirRanks) {
  BpeOptions options;
  options.symbols = 1000;
  const Tokenizer tok = Tokenizer::from_json(tokenizer_json(train_bpe(kHugWords, options)), "hug");
  // Symbol s has id 9 + s. "hugs": h u g s -> h ug s -> hug s -> hugs (261).
  EXPECT_EQ(tok.encode("hugs", false), std::vector<int>{9 + 261});
  EXPECT_EQ(tok.encode("bun", false), std::vector<int>{9 + 262});
  // No merge applies to "gub".
  EXPECT_EQ(tok.encode("gub", false), (std::vector<int>{9 + 'g', 9 + 'u', 9 + 'b'}));
  // With the post-processor, BOS (0) first.
  EXPECT_EQ(tok.encode("pun"), (std::vector<int>{0, 9 + 259}));
}

TEST(TrainDataTokenizer, WordsAreCountedAsThePreTokenizerCutsThem) {
  WordCounter c;
  // DeepSeek's split: a letter run takes one leading non-letter ("␣world"); punctuation runs
  // apart; digits in groups of at most three; an added token is cut out and not counted.
  c.add("Hello world, hello world!");
  c.add("12345<｜User｜>x");
  WordCounter other;
  other.add("hello");
  c.merge(other);
  EXPECT_EQ(c.words(), (std::vector<std::pair<std::string, uint64_t>>{
                           {" hello", 1}, {" world", 2}, {"!", 1}, {",", 1}, {"123", 1}, {"45", 1}, {"Hello", 1},
                           {"hello", 1}, {"x", 1}}));
}

// A small corpus: a few lines of English and one of everything else.
std::string sample_text() {
  return "In the beginning God created the heaven and the earth.\n"
         "And the earth was without form, and void; and darkness was upon the face of the deep.\n"
         "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
         "of a wife.\n"
         "Caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC 12345 \xF0\x9F\x98\x80 tabs\tand  spaces\r\n";
}

Tokenizer trained_on(const std::string& text, size_t vocab) {
  WordCounter c;
  c.add(text);
  BpeOptions options;
  options.symbols = vocab - kAddedTokens.size();
  return Tokenizer::from_json(tokenizer_json(train_bpe(c.words(), options)), "trained");
}

TEST(TrainDataTokenizer, TheFilesLayoutAsDsv41ReadsIt) {
  const Tokenizer tok = trained_on(sample_text() + sample_text(), 400);
  // Added tokens 0..8, bytes 9..264 (byte b is GPT-2's character for b), then merged symbols.
  EXPECT_EQ(tok.id_to_token(0), chat_token::kBos);
  EXPECT_EQ(tok.id_to_token(1), chat_token::kEos);
  EXPECT_EQ(tok.id_to_token(2), "<｜▁pad▁｜>");
  EXPECT_EQ(tok.id_to_token(8), chat_token::kDsml);
  EXPECT_EQ(tok.id_to_token(9), "\xC4\x80");        // byte 0: U+0100
  EXPECT_EQ(tok.id_to_token(9 + ' '), "\xC4\xA0");  // space: U+0120 'Ġ'
  EXPECT_EQ(tok.id_to_token(9 + 'A'), "A");
  EXPECT_EQ(tok.id_to_token(264), "\xC3\xBF");      // byte 255: U+00FF
  EXPECT_LE(tok.vocab_size(), 400u);
  EXPECT_GT(tok.vocab_size(), 265u);
  for (int id = 0; id < 3; ++id) EXPECT_TRUE(tok.is_special(id)) << id;
  for (int id = 3; id < 9; ++id) EXPECT_FALSE(tok.is_special(id)) << id;

  // Each chat marker is one id, in a rendered conversation too.
  for (size_t i = 0; i < kAddedTokens.size(); ++i)
    EXPECT_EQ(tok.encode(std::string(kAddedTokens[i].content), false), std::vector<int>{int(i)});
  std::vector<ChatMessage> messages(2);
  messages[0].role = ChatRole::system;
  messages[0].content = "Be brief.";
  messages[1].content = "Hello";
  const std::vector<int> prompt = tok.encode(render_chat(messages, ChatOptions{}), false);
  ASSERT_GE(prompt.size(), 4u);
  EXPECT_EQ(prompt[0], 0);  // BOS
  EXPECT_EQ(prompt[1], 3);  // <｜System｜>
  EXPECT_EQ(std::vector<int>(prompt.end() - 2, prompt.end()), (std::vector<int>{5, 6}));  // <｜Assistant｜><think>

  test::TempDir dir("tokenizer_config");
  std::filesystem::create_directories(dir.path());
  std::ofstream(dir / "tokenizer_config.json") << tokenizer_config_json();
  EXPECT_EQ(config_eos_id(dir.string(), tok), std::optional<int>(1));
}

// Random text from every kind of character the pre-tokenizer treats apart.
std::string random_text(std::mt19937_64& rng) {
  static const std::vector<std::string> pieces = {
      "a", "Z", "the", " ", "  ", "\t", "\n", "\r\n", "\xC2\xA0", "0", "42", "12345", ".", ",", "!?", "'s", "--", "\xE2\x80\x94",
      "\xC3\xA9", "e\xCC\x81", "\xE6\x97\xA5\xE6\x9C\xAC", "\xF0\x9F\x98\x80", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB",
      "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D", "\x01", "\x7F", "\xEF\xBF\xBD", "<think>", "</think>", "<｜User｜>", "｜", "<", "\xE2\x80\xAE"};
  std::string s;
  const int n = int(rng() % 24);
  for (int i = 0; i < n; ++i) s += pieces[rng() % pieces.size()];
  return s;
}

TEST(TrainDataTokenizer, DecodeOfEncodeIsTheTextForAnyUtf8AndAnyBytes) {
  const Tokenizer tok = trained_on(sample_text(), 320);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3000; ++i) {
    const std::string text = random_text(rng);
    ASSERT_EQ(tok.decode(tok.encode(text, false)), text) << nlohmann::json(text).dump();
  }
  // Any bytes: the text is read as UTF-8 with each invalid sequence one U+FFFD (as HF does), so
  // that is what comes back; every byte value, alone and in runs.
  for (int i = 0; i < 3000; ++i) {
    std::string bytes(size_t(rng() % 16), '\0');
    for (char& b : bytes) b = char(rng() % 256);
    ASSERT_EQ(tok.decode(tok.encode(bytes, false)), unicode::to_valid_utf8(bytes)) << i;
  }
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, char(b)), run(3, char(b));
    EXPECT_EQ(tok.decode(tok.encode(one, false)), unicode::to_valid_utf8(one)) << b;
    EXPECT_EQ(tok.decode(tok.encode(run, false)), unicode::to_valid_utf8(run)) << b;
  }
}

TEST(TrainDataTokenizer, TrainingIsDeterministic) {
  // The same text counted in another order (and by two counters joined) gives the same file.
  const std::string a = sample_text(), b = "Another line, of other words: hugs and puns.\n";
  WordCounter one, two, three;
  one.add(a);
  one.add(b);
  two.add(b);
  three.add(a);
  two.merge(three);
  BpeOptions options;
  options.symbols = 330;
  const std::string first = tokenizer_json(train_bpe(one.words(), options));
  EXPECT_EQ(first, tokenizer_json(train_bpe(two.words(), options)));
  EXPECT_EQ(first, tokenizer_json(train_bpe(one.words(), options)));
}

}  // namespace
}  // namespace dsv41::train
