// Chat documents (src/train/data/chat_documents.h, docs/training-data.md "Chat documents"): each
// dictionary's entries turned into question-and-answer turns, worked out by hand below (a word's
// phrasing is chosen by FNV-1a of the word, computed for these words outside the code: river 1 of
// 3, apple 0, abort 2, Kenya 1; breathe 0 of 2, quick 0; hacker 1, "All hardware sucks, …" 0); the
// rendering token for token what the server renders; and `dsv41 data build --chat`, whose chat
// documents stay in the split of the entry they come from.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "engine/chat_format.h"
#include "model/tokenizer/tokenizer.h"
#include "test_util.h"
#include "train/data/chat_documents.h"
#include "train/data/corpus.h"

namespace dsv41::train {
namespace {

namespace fs = std::filesystem;

void expect_turn(const std::optional<ChatTurn>& t, const std::string& question, const std::string& answer) {
  ASSERT_TRUE(t.has_value()) << question;
  EXPECT_EQ(t->question, question);
  EXPECT_EQ(t->answer, answer);
}

TEST(TrainDataChat, WordnetSynsetsBecomeDefinitions) {
  expect_turn(wordnet_turn("river (noun): a large natural stream of water (larger than a creek); \"the river was navigable for 50 miles\""),
              "What does \"river\" mean?",
              "A river is a large natural stream of water (larger than a creek). For example: \"the river was navigable for 50 miles\"");
  expect_turn(wordnet_turn("apple, orchard apple tree, Malus pumila (noun): native Eurasian tree widely cultivated for its fruits"),
              "What is an apple?",
              "An apple is native Eurasian tree widely cultivated for its fruits. Other words for it are orchard apple tree and Malus "
              "pumila.");
  expect_turn(wordnet_turn("abort (noun): the act of terminating a project before it is completed; \"I wasted a year\"; \"he sent a "
                           "short message\""),
              "Can you define abort?", "An abort is the act of terminating a project before it is completed. For example: \"I wasted a year\"");
  // A proper noun takes no article.
  expect_turn(wordnet_turn("Kenya, Republic of Kenya (noun): a republic in eastern Africa"), "What does \"Kenya\" mean?",
              "Kenya is a republic in eastern Africa. Another word for it is Republic of Kenya.");
  expect_turn(wordnet_turn("breathe, take a breath, respire, suspire (verb): draw air into, and expel out of, the lungs; \"I can "
                           "breathe better when the air is clean\"; \"The patient is respiring\""),
              "What does it mean to breathe?",
              "To breathe is to draw air into, and expel out of, the lungs. Other words for it are take a breath, respire and "
              "suspire. For example: \"I can breathe better when the air is clean\"");
  expect_turn(wordnet_turn("quick (adjective): moving quickly"), "What does \"quick\" mean?", "\"quick\" means moving quickly.");
  EXPECT_FALSE(wordnet_turn("a line without a part of speech"));
  EXPECT_FALSE(wordnet_turn("word (noun): "));
  EXPECT_FALSE(wordnet_turn(" (noun): a gloss without a word"));
}

TEST(TrainDataChat, DictionaryEntriesBecomeAnswers) {
  expect_turn(devil_turn("ABDICATION, n. An act whereby a sovereign attests his sense of the high temperature of the throne.\n\n"
                         "    Poor Isabella's Dead, whose abdication\n    Set all tongues wagging in the Spanish nation.\n"),
              "What is abdication?", "An act whereby a sovereign attests his sense of the high temperature of the throne.");
  expect_turn(devil_turn("ABSCOND, v.i. To \"move in a mysterious way,\" commonly with the property of another"),
              "What does \"abscond\" mean?", "To \"move in a mysterious way,\" commonly with the property of another.");
  EXPECT_FALSE(devil_turn("Not a headword, n. because it is not in capitals."));
  EXPECT_FALSE(devil_turn("ABSCOND without a part of speech"));

  expect_turn(jargon_turn("hacker", "hacker: n.\n\n[originally, someone who makes furniture with an axe] A person who enjoys "
                                    "exploring the details of programmable systems\n\nA second paragraph.\n"),
              "In the Jargon File, what is \"hacker\"?", "A person who enjoys exploring the details of programmable systems.");
  expect_turn(jargon_turn("All hardware sucks, all software sucks.",
                          "All hardware sucks, all software sucks.: prov.\n\n[from scary devil monastery] A general recognition of "
                          "the fallibility of any computer system.\n"),
              "What does \"All hardware sucks, all software sucks.\" mean in hacker slang?",
              "A general recognition of the fallibility of any computer system.");
  EXPECT_FALSE(jargon_turn("kludge", "kludge: n.\n\nSee kluge.\n")) << "an entry that only points elsewhere";
  EXPECT_FALSE(jargon_turn("Chapter 2. Of Slang", "Chapter 2. Of Slang\n\nLinguists usually refer to slang.\n")) << "a section";
}

TEST(TrainDataChat, AConversationIsTrainedAsItIsServed) {
  const std::vector<ChatTurn> turns = {{"What is a river?", "A river is a stream."}, {"And a creek?", "A small stream."}};
  EXPECT_EQ(chat_text(turns),
            "<｜User｜>What is a river?<｜Assistant｜></think>A river is a stream.<｜end▁of▁sentence｜>"
            "<｜User｜>And a creek?<｜Assistant｜></think>A small stream.");
  EXPECT_THROW(chat_text({}), Error);

  // Packed (BOS, the text, EOS: packed_tokens.h) it is token for token the served conversation,
  // and the served prompt of the second turn is a prefix of it: what follows is the reply the
  // server decodes.
  const Tokenizer tok = Tokenizer::from_file(std::string(DSV41_SOURCE_DIR) + "/assets/default-model/tokenizer.json");
  std::vector<int> packed = tok.encode(chat_text(turns), /*add_special_tokens=*/true);
  packed.push_back(tok.token_to_id(std::string(chat_token::kEos)).value());
  std::vector<ChatMessage> messages(4);
  for (size_t i = 0; i < 4; ++i) {
    messages[i].role = i % 2 ? ChatRole::assistant : ChatRole::user;
    messages[i].content = i % 2 ? turns[i / 2].answer : turns[i / 2].question;
  }
  ChatOptions off;
  off.thinking = false;
  EXPECT_EQ(packed, tok.encode(render_chat(messages, off), false));
  messages.pop_back();
  const std::vector<int> prompt = tok.encode(render_chat(messages, off), false);
  ASSERT_LT(prompt.size(), packed.size());
  EXPECT_TRUE(std::equal(prompt.begin(), prompt.end(), packed.begin()));
  EXPECT_EQ(tok.decode(std::vector<int>(packed.begin() + long(prompt.size()), packed.end() - 1)), turns[1].answer);
}

TEST(TrainDataChat, DocumentsComeFromTheDictionariesOnly) {
  std::string fifty;
  for (int i = 0; i < 50; ++i) fifty += "word" + std::to_string(i) + " (noun): gloss " + std::to_string(i) + "\n";
  const std::vector<Document> docs = {{"kjv", "Genesis 1", "Genesis 1\n\nIn the beginning.\n"},
                                      {"wordnet", "noun/00001740", fifty},
                                      {"devil", "abdication", "ABDICATION, n. An act.\n"},
                                      {"jargon", "kludge", "kludge: n.\n\nSee kluge.\n"}};
  const std::vector<Document> chat = chat_documents(docs);
  ASSERT_EQ(chat.size(), 2u);
  EXPECT_EQ(chat[0].source, "chat");
  EXPECT_EQ(chat[0].key, "wordnet/noun/00001740");
  // Four of the fifty synsets, evenly spread: lines 0, 12, 25 and 37.
  for (const char* w : {"A word0 is gloss 0.", "A word12 is gloss 12.", "A word25 is gloss 25.", "A word37 is gloss 37."})
    EXPECT_NE(chat[0].text.find(w), std::string::npos) << w << " in " << chat[0].text;
  EXPECT_EQ(chat[0].text.find("word1 "), std::string::npos);
  EXPECT_EQ(chat[1].key, "devil/abdication");
  EXPECT_EQ(chat[1].text, "<｜User｜>What is abdication?<｜Assistant｜></think>An act.");
}

TEST(TrainDataChat, TheBuildKeepsEachTurnInItsEntrysSplit) {
  test::TempDir dir("data_build_chat");
  const test::Outcome out = test::run_dsv41("data build --sources devil --vocab 1024 --chat --json --out " + dir.string());
  ASSERT_EQ(out.status, 0) << out.output;
  const nlohmann::json summary = nlohmann::json::parse(out.output);
  ASSERT_EQ(summary["sources"].size(), 2u);
  const nlohmann::json &devil = summary["sources"][0], &chat = summary["sources"][1];
  EXPECT_EQ(chat["name"], "chat");
  std::map<std::string, int> split_of;  // devil key → 0 train, 1 validation
  int counted[2] = {0, 0};
  for (int s = 0; s < 2; ++s)
    for (const Document& d : read_documents((dir / (s == 0 ? "train.jsonl" : "validation.jsonl")).string())) {
      if (d.source == "devil") split_of[d.key] = s;
      if (d.source != "chat") continue;
      ++counted[s];
      ASSERT_TRUE(d.key.starts_with("devil/")) << d.key;
      ASSERT_TRUE(split_of.contains(d.key.substr(6))) << d.key << ": its entry comes before it, in the same split";
      EXPECT_EQ(split_of[d.key.substr(6)], s) << d.key;
    }
  EXPECT_EQ(chat["train_documents"], counted[0]);
  EXPECT_EQ(chat["validation_documents"], counted[1]);
  EXPECT_GT(counted[1], 0);
  // Nearly every entry of the Devil's Dictionary is "WORD, pos. definition".
  const int entries = devil["train_documents"].get<int>() + devil["validation_documents"].get<int>();
  EXPECT_GE(counted[0] + counted[1], entries * 9 / 10) << entries << " entries";
  EXPECT_LE(counted[0] + counted[1], entries);
}

}  // namespace
}  // namespace dsv41::train
