#include "train/data/data_build.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "model/tokenizer/tokenizer.h"
#include "train/data/bpe_trainer.h"
#include "train/data/chat_documents.h"
#include "train/data/packed_tokens.h"
#include "train/data/tokenizer_json.h"

namespace dsv41::train {

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void write_file(const std::filesystem::path& path, const std::string& text) {
  const std::filesystem::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) fail(partial.string(), "a complete write", "an error");
  }
  std::filesystem::rename(partial, path);
}

// The documents tokenized by `threads` threads (each takes every threads-th document) and
// written in corpus order.
SplitSummary pack(const std::vector<Document>& docs, const Tokenizer& tokenizer, const std::string& path, int threads,
                  const std::function<void(uint64_t)>& done) {
  std::vector<std::vector<int>> ids(docs.size());
  std::atomic<uint64_t> finished = 0;
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t)
    workers.emplace_back([&, t] {
      for (size_t i = size_t(t); i < docs.size(); i += size_t(threads)) {
        ids[i] = tokenizer.encode(docs[i].text, /*add_special_tokens=*/true);
        ++finished;
      }
    });
  while (finished < docs.size()) {
    if (done) done(finished);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (std::thread& w : workers) w.join();
  if (done) done(docs.size());

  PackedTokenWriter writer(path, uint32_t(tokenizer.vocab_size()), kEosId);
  SplitSummary s;
  for (size_t i = 0; i < docs.size(); ++i) {
    writer.add_document(ids[i]);
    s.documents += 1;
    s.bytes += int64_t(docs[i].text.size());
    s.tokens += int64_t(ids[i].size()) + 1;
  }
  writer.finish();
  return s;
}

std::string notice(const std::vector<Source>& sources) {
  std::string text =
      "The corpus in this directory was made by `dsv41 data build` from these sources (docs/training-data.md\n"
      "argues each licence):\n\n";
  for (const Source& s : sources) text += "- " + s.name + ": " + s.title + ". " + s.package + ". Licence: " + s.licence + ".\n";
  for (const Source& s : sources)
    if (s.name == "wordnet")
      text +=
          "\nThe wordnet documents are derived from WordNet 3.0, under its licence, which asks that this notice go\n"
          "with every copy:\n\n"
          "  WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved.\n\n"
          "  THIS SOFTWARE AND DATABASE IS PROVIDED \"AS IS\" AND PRINCETON UNIVERSITY MAKES NO REPRESENTATIONS OR\n"
          "  WARRANTIES, EXPRESS OR IMPLIED. BY WAY OF EXAMPLE, BUT NOT LIMITATION, PRINCETON UNIVERSITY MAKES NO\n"
          "  REPRESENTATIONS OR WARRANTIES OF MERCHANT-ABILITY OR FITNESS FOR ANY PARTICULAR PURPOSE OR THAT THE USE\n"
          "  OF THE LICENSED SOFTWARE, DATABASE OR DOCUMENTATION WILL NOT INFRINGE ANY THIRD PARTY PATENTS,\n"
          "  COPYRIGHTS, TRADEMARKS OR OTHER RIGHTS.\n\n"
          "  The name of Princeton University or Princeton may not be used in advertising or publicity pertaining\n"
          "  to distribution of the software and/or database. Title to copyright in this software, database and\n"
          "  any associated documentation shall at all times remain with Princeton University and LICENSEE agrees\n"
          "  to preserve same.\n";
  return text;
}

}  // namespace

DataBuildSummary build_data(const DataBuildOptions& options, const std::function<void(const BuildProgress&)>& progress) {
  if (options.vocab_size < kAddedTokens.size() + 256)
    fail("vocabulary size", "at least " + std::to_string(kAddedTokens.size() + 256) + " (the added tokens and the 256 bytes)",
         std::to_string(options.vocab_size));
  if (options.threads < 1) fail("threads", "at least 1", std::to_string(options.threads));
  const std::filesystem::path dir(options.out_dir);
  std::filesystem::create_directories(dir);
  auto report = [&](std::string stage, uint64_t done, uint64_t total) {
    if (progress) progress({std::move(stage), done, total});
  };
  DataBuildSummary summary;

  auto t = Clock::now();
  const std::vector<Source> sources = options.sources.empty() ? corpus_sources() : select_sources(options.sources);
  Corpus corpus = build_corpus(sources, options.corpus, [&](std::string_view source, size_t done, size_t total) {
    report("corpus: " + std::string(source), done, total);
  });
  if (corpus.train.empty()) fail("corpus", "documents in the train split", "none");
  if (options.chat) {
    SourceStats chat{.name = "chat"};
    for (int split = 0; split < 2; ++split) {
      std::vector<Document>& docs = split == 0 ? corpus.train : corpus.validation;
      const std::vector<Document> turns = chat_documents(docs);
      for (const Document& d : turns) chat.kept_bytes[split] += int64_t(d.text.size());
      chat.kept_documents[split] = int64_t(turns.size());
      docs.insert(docs.end(), turns.begin(), turns.end());
    }
    chat.documents = chat.kept_documents[0] + chat.kept_documents[1];
    chat.bytes = chat.kept_bytes[0] + chat.kept_bytes[1];
    corpus.sources.push_back(chat);
  }
  write_documents((dir / "train.jsonl").string(), corpus.train);
  write_documents((dir / "validation.jsonl").string(), corpus.validation);
  write_file(dir / "NOTICE", notice(sources));
  summary.sources = corpus.sources;
  summary.seconds_corpus = since(t);

  t = Clock::now();
  WordCounter counter;
  for (size_t i = 0; i < corpus.train.size(); ++i) {
    counter.add(corpus.train[i].text);
    if ((i + 1) % 1024 == 0) report("tokenizer: words", i + 1, corpus.train.size());
  }
  const auto words = counter.words();
  summary.words = words.size();
  BpeOptions bpe;
  bpe.symbols = options.vocab_size - kAddedTokens.size();
  bpe.progress = [&](size_t done, size_t total) { report("tokenizer: vocabulary", done, total); };
  const BpeModel model = train_bpe(words, bpe);
  const std::string json = tokenizer_json(model);
  write_file(dir / "tokenizer.json", json);
  write_file(dir / "tokenizer_config.json", tokenizer_config_json());
  summary.vocab_size = kAddedTokens.size() + model.symbols.size();
  summary.seconds_tokenizer = since(t);

  t = Clock::now();
  const Tokenizer tokenizer = Tokenizer::from_json(json, (dir / "tokenizer.json").string());
  summary.train = pack(corpus.train, tokenizer, (dir / "train.tokens").string(), options.threads,
                       [&](uint64_t done) { report("packing: train", done, corpus.train.size()); });
  summary.validation = pack(corpus.validation, tokenizer, (dir / "validation.tokens").string(), options.threads,
                            [&](uint64_t done) { report("packing: validation", done, corpus.validation.size()); });
  summary.seconds_packing = since(t);
  write_file(dir / "summary.json", summary_json(summary));
  return summary;
}

std::string summary_json(const DataBuildSummary& s) {
  using ojson = nlohmann::ordered_json;
  ojson sources = ojson::array();
  for (const SourceStats& x : s.sources)
    sources.push_back({{"name", x.name},
                       {"documents", x.documents},
                       {"bytes", x.bytes},
                       {"empty", x.empty},
                       {"exact_duplicates", x.exact_duplicates},
                       {"near_duplicates", x.near_duplicates},
                       {"train_documents", x.kept_documents[0]},
                       {"train_bytes", x.kept_bytes[0]},
                       {"validation_documents", x.kept_documents[1]},
                       {"validation_bytes", x.kept_bytes[1]}});
  auto split = [](const SplitSummary& p) {
    return ojson{{"documents", p.documents},
                 {"bytes", p.bytes},
                 {"tokens", p.tokens},
                 {"text_tokens", p.tokens - 2 * p.documents},
                 {"bytes_per_text_token", p.tokens > 2 * p.documents ? double(p.bytes) / double(p.tokens - 2 * p.documents) : 0.0}};
  };
  const ojson j = {{"sources", sources},
                   {"train", split(s.train)},
                   {"validation", split(s.validation)},
                   {"vocab_size", s.vocab_size},
                   {"words", s.words},
                   {"seconds", {{"corpus", s.seconds_corpus}, {"tokenizer", s.seconds_tokenizer}, {"packing", s.seconds_packing}}}};
  return j.dump(2) + "\n";
}

}  // namespace dsv41::train
