#include "cli/model_dir.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace dsv41::cli {

namespace {

// The end-of-sequence id, from tokenizer_config.json's eos_token when the tokenizer knows it.
std::optional<int> eos_id(const std::string& dir, const Tokenizer& tokenizer) {
  std::ifstream in(dir + "/tokenizer_config.json");
  if (!in) return std::nullopt;
  nlohmann::json c = nlohmann::json::parse(in, nullptr, false);
  if (c.is_discarded() || !c.contains("eos_token")) return std::nullopt;
  const nlohmann::json& e = c["eos_token"];
  std::string text = e.is_string() ? e.get<std::string>() : e.value("content", "");
  return tokenizer.token_to_id(text);
}

}  // namespace

ModelDir load_model_dir(const std::string& dir) {
  ModelDir m;
  m.dir = dir;
  m.model = Model::load(dir);
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    m.tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
    if (std::optional<int> eos = eos_id(dir, *m.tokenizer)) m.stop_ids.push_back(*eos);
  }
  return m;
}

}  // namespace dsv41::cli
