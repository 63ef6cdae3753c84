#pragma once
// `dsv41 data build`: the whole pipeline into one directory (docs/training-data.md):
//   corpus (sources → cleaned → deduplicated → split)  train.jsonl, validation.jsonl
//   with `chat`, each split's chat documents after it  (chat_documents.h)
//   tokenizer, trained on the train split only          tokenizer.json, tokenizer_config.json
//   both splits tokenized and packed                    train.tokens, validation.tokens
//   what was done, in numbers                           summary.json
//   the sources and their licences                      NOTICE
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/data/corpus.h"

namespace dsv41::train {

struct DataBuildOptions {
  std::string out_dir;
  std::vector<std::string> sources;  // names (sources.h); empty: every source
  CorpusOptions corpus;
  size_t vocab_size = 8192;  // added tokens included
  int threads = 2;           // for tokenizing
  // Chat documents derived from each split's dictionary entries (chat_documents.h), appended to
  // that split and counted in the summary as source "chat".
  bool chat = false;
};

struct SplitSummary {
  int64_t documents = 0, bytes = 0, tokens = 0;  // tokens: BOS and EOS included
};

struct DataBuildSummary {
  std::vector<SourceStats> sources;
  SplitSummary train, validation;
  size_t vocab_size = 0;  // as trained: less than asked when the corpus runs out of pairs
  size_t words = 0;       // distinct pre-tokenized words in the train split
  double seconds_corpus = 0, seconds_tokenizer = 0, seconds_packing = 0;
};

struct BuildProgress {
  std::string stage;  // e.g. "corpus: kjv", "tokenizer", "packing train"
  uint64_t done = 0, total = 0;  // total 0: not known
};

DataBuildSummary build_data(const DataBuildOptions& options, const std::function<void(const BuildProgress&)>& progress = {});

std::string summary_json(const DataBuildSummary& summary);

}  // namespace dsv41::train
