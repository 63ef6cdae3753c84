#pragma once
// The corpus: every source's documents cleaned (text_clean.h), deduplicated (dedup.h) in the
// sources' fixed order, and split train/validation (split.h). Documents are written as JSON
// lines, {"source": ..., "key": ..., "text": ...}, one per line, in corpus order.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "train/data/document.h"
#include "train/data/sources.h"
#include "train/data/split.h"

namespace dsv41::train {

struct SourceStats {
  std::string name;
  int64_t documents = 0;         // as the source gave them
  int64_t bytes = 0;             // their raw text
  int64_t empty = 0;             // nothing left after cleaning
  int64_t exact_duplicates = 0;
  int64_t near_duplicates = 0;
  int64_t kept_documents[2] = {0, 0};  // by Split: train, validation
  int64_t kept_bytes[2] = {0, 0};      // their cleaned text
};

struct CorpusOptions {
  double validation_fraction = 0.02;
  double near_duplicate_fraction = 0.8;  // Deduplicator's
};

struct Corpus {
  std::vector<Document> train, validation;
  std::vector<SourceStats> sources;
};

// Called with the source being read and how many documents of it are done.
using CorpusProgress = std::function<void(std::string_view source, size_t done, size_t total)>;

// A source whose keys repeat is an error naming the key (the split needs unique identities).
Corpus build_corpus(const std::vector<Source>& sources, const CorpusOptions& options, const CorpusProgress& progress = {});

void write_documents(const std::string& path, const std::vector<Document>& documents);
std::vector<Document> read_documents(const std::string& path);

}  // namespace dsv41::train
