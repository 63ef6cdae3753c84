#pragma once
// The tokenizer oracle, transformers.js (@lenml/tokenizers in tests/oracle/node_modules, installed
// by scripts/setup-oracle.sh): the ids it gives for every line of a corpus of JSON-string lines.
// Shared by tokenizer_oracle_test (DeepSeek's and others' tokenizers) and
// train_data_oracle_test (the tokenizer the project trains).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace dsv41::test {

inline const std::filesystem::path kOracle = std::filesystem::path(DSV41_TEST_DATA).parent_path() / "oracle";

// The strings of a file with one JSON string per line.
inline std::vector<std::string> read_jsonl(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line).get<std::string>());
  return lines;
}

// transformers.js's ids for every line of `corpus`, from one node process. `tokenizer` is a
// name that tests/oracle/encode.js knows or the path of a tokenizer.json.
inline std::vector<std::vector<int>> oracle_ids(const std::string& tokenizer, const std::filesystem::path& corpus) {
  if (!std::filesystem::exists(kOracle / "node_modules" / "@lenml" / "tokenizers"))
    throw std::runtime_error("the oracle is not installed: run scripts/setup-oracle.sh");
  std::string cmd = "node '" + (kOracle / "encode.js").string() + "' '" + tokenizer + "' '" + corpus.string() + "'";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::vector<std::vector<int>> ids;
  std::string line;
  char buffer[1 << 16];
  while (std::fgets(buffer, sizeof buffer, pipe)) {
    line += buffer;
    if (line.empty() || line.back() != '\n') continue;
    ids.push_back(nlohmann::json::parse(line).get<std::vector<int>>());
    line.clear();
  }
  if (::pclose(pipe) != 0) throw std::runtime_error(cmd + " failed");
  return ids;
}

}  // namespace dsv41::test
