#include "train/data/corpus.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unordered_set>

#include "base/error.h"
#include "train/data/dedup.h"
#include "train/data/text_clean.h"

namespace dsv41::train {

Corpus build_corpus(const std::vector<Source>& sources, const CorpusOptions& options, const CorpusProgress& progress) {
  Corpus corpus;
  Deduplicator dedup(options.near_duplicate_fraction);
  for (const Source& source : sources) {
    if (progress) progress(source.name, 0, 0);
    std::vector<Document> docs = source.read();
    SourceStats stats;
    stats.name = source.name;
    std::unordered_set<std::string> keys;
    for (size_t i = 0; i < docs.size(); ++i) {
      Document& d = docs[i];
      if (!keys.insert(d.key).second) fail("source " + source.name, "unique document keys", "\"" + d.key + "\" twice");
      stats.documents += 1;
      stats.bytes += int64_t(d.text.size());
      d.source = source.name;
      d.text = clean_text(d.text, source.hard_wrapped, source.name + " document \"" + d.key + "\"");
      if (progress && (i + 1) % 256 == 0) progress(source.name, i + 1, docs.size());
      if (d.text.empty()) {
        stats.empty += 1;
        continue;
      }
      switch (dedup.offer(d.text)) {
        case Verdict::exact_duplicate:
          stats.exact_duplicates += 1;
          continue;
        case Verdict::near_duplicate:
          stats.near_duplicates += 1;
          continue;
        case Verdict::kept:
          break;
      }
      const Split split = split_of(d.source, d.key, options.validation_fraction);
      stats.kept_documents[int(split)] += 1;
      stats.kept_bytes[int(split)] += int64_t(d.text.size());
      (split == Split::train ? corpus.train : corpus.validation).push_back(std::move(d));
    }
    if (progress) progress(source.name, docs.size(), docs.size());
    corpus.sources.push_back(std::move(stats));
  }
  return corpus;
}

void write_documents(const std::string& path, const std::vector<Document>& documents) {
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    for (const Document& d : documents)
      out << nlohmann::ordered_json{{"source", d.source}, {"key", d.key}, {"text", d.text}}.dump() << "\n";
    if (!out) fail(partial, "a complete write", "an error");
  }
  std::filesystem::rename(partial, path);
}

std::vector<Document> read_documents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a documents file (JSON lines)", "no readable file");
  std::vector<Document> docs;
  size_t number = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    const std::string where = path + ":" + std::to_string(number);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(where, "a JSON object", e.what());
    }
    if (!j.is_object() || !j["source"].is_string() || !j["key"].is_string() || !j["text"].is_string())
      fail(where, "{\"source\": string, \"key\": string, \"text\": string}", line.substr(0, 80));
    docs.push_back({j["source"].get<std::string>(), j["key"].get<std::string>(), j["text"].get<std::string>()});
  }
  return docs;
}

}  // namespace dsv41::train
