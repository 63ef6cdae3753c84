#pragma once
// The trainer's tests' data: a directory as `dsv41 data build` writes it (tokenizer.json,
// tokenizer_config.json, train.tokens, validation.tokens) over a small fixed corpus, made in a few
// milliseconds without the installed sources. The documents are sentences of a little grammar over
// a few dozen words ("The old dog sees a small bird."), drawn by std::mt19937, whose outputs the
// standard fixes (no std distribution is used), so every machine trains on the same bytes. Their
// structure — a determiner before an adjective or a noun, a verb after the subject, a full stop
// and a capital — is what a model learns in its first steps.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "train/data/bpe_trainer.h"
#include "train/data/packed_tokens.h"
#include "train/data/tokenizer_json.h"

namespace dsv41::test {

inline std::string corpus_document(std::mt19937& rng) {
  static const std::vector<std::string> det = {"the", "a", "every", "one"}, adj = {"old", "small", "red", "quiet", "happy", "tall"},
                                        noun = {"dog", "bird", "child", "farmer", "river", "house", "king", "horse"},
                                        verb = {"sees", "follows", "finds", "hears", "loves", "carries"},
                                        place = {"near the hill", "by the sea", "in the town", "at night"};
  auto pick = [&](const std::vector<std::string>& words) { return words[rng() % words.size()]; };
  std::string doc;
  const int sentences = 3 + int(rng() % 4);
  for (int s = 0; s < sentences; ++s) {
    // One word a statement: the operands of + are evaluated in no fixed order.
    std::string sentence = pick(det);
    for (const std::vector<std::string>* words : {&adj, &noun, &verb, &det}) {
      sentence += ' ';
      sentence += pick(*words);
    }
    if (rng() % 2) {
      sentence += ' ';
      sentence += pick(adj);
    }
    sentence += ' ';
    sentence += pick(noun);
    if (rng() % 3 == 0) {
      sentence += ' ';
      sentence += pick(place);
    }
    sentence[0] = char(std::toupper(static_cast<unsigned char>(sentence[0])));
    if (s) doc += ' ';
    doc += sentence;
    doc += '.';
  }
  return doc;
}

// Writes the data directory `dir`: `documents` documents, one in ten to the validation split, a
// tokenizer of 265 + `merges` ids trained on the train split.
inline void write_small_corpus(const std::filesystem::path& dir, int documents = 600, size_t merges = 160) {
  std::filesystem::create_directories(dir);
  std::mt19937 rng(2024);
  std::vector<std::string> train, validation;
  for (int d = 0; d < documents; ++d) (d % 10 == 9 ? validation : train).push_back(corpus_document(rng));

  train::WordCounter counter;
  for (const std::string& doc : train) counter.add(doc);
  train::BpeOptions bpe;
  bpe.symbols = 256 + merges;
  const std::string json = train::tokenizer_json(train::train_bpe(counter.words(), bpe));
  std::ofstream(dir / "tokenizer.json", std::ios::binary) << json;
  std::ofstream(dir / "tokenizer_config.json", std::ios::binary) << train::tokenizer_config_json();

  const Tokenizer tokenizer = Tokenizer::from_json(json, "small corpus tokenizer");
  for (const auto& [name, docs] : {std::pair{"train.tokens", &train}, std::pair{"validation.tokens", &validation}}) {
    train::PackedTokenWriter writer((dir / name).string(), uint32_t(tokenizer.vocab_size()), uint32_t(train::kEosId));
    for (const std::string& doc : *docs) writer.add_document(tokenizer.encode(doc, /*add_special_tokens=*/true));
    writer.finish();
  }
}

}  // namespace dsv41::test
