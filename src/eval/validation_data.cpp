#include "eval/validation_data.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace dsv41::eval {

void check_same_tokenizer(const Tokenizer& model, const Tokenizer& data, const std::string& where) {
  if (data.vocab_size() != model.vocab_size())
    fail(where, "the model's tokenizer (" + std::to_string(model.vocab_size()) + " tokens)",
         "a tokenizer of " + std::to_string(data.vocab_size()) + " tokens");
  for (size_t id = 0; id < model.vocab_size(); ++id) {
    const std::string m = model.id_to_token(int(id)), d = data.id_to_token(int(id));
    if (m != d)
      fail(where, "the model's tokenizer (id " + std::to_string(id) + " is \"" + m + "\")",
           "a different one (id " + std::to_string(id) + " is \"" + d + "\")");
  }
}

namespace {

std::vector<std::string> read_texts(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail(path.string(), "the validation documents (dsv41 data build writes them)", "no such file");
  std::vector<std::string> texts;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    nlohmann::json doc = nlohmann::json::parse(line, nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || !doc.contains("text") || !doc["text"].is_string())
      fail(path.string() + " line " + std::to_string(n), "a JSON object with a \"text\" string", line.substr(0, 80));
    texts.push_back(doc["text"].get<std::string>());
  }
  if (texts.empty()) fail(path.string(), "at least one validation document", "none");
  return texts;
}

}  // namespace

ValidationData read_validation(const std::string& dir, const Config& config, const Tokenizer& tokenizer, bool texts) {
  const std::filesystem::path root(dir);
  if (!std::filesystem::is_directory(root)) fail(dir, "a data directory (dsv41 data build --out DIR)", "no such directory");
  const std::filesystem::path tokens_path = root / "validation.tokens", tokenizer_path = root / "tokenizer.json";
  if (!std::filesystem::exists(tokens_path))
    fail(tokens_path.string(), "the packed validation tokens (dsv41 data build writes them)", "no such file");
  if (!std::filesystem::exists(tokenizer_path))
    fail(tokenizer_path.string(), "the tokenizer the data was packed with (dsv41 data build writes it)", "no such file");
  check_same_tokenizer(tokenizer, Tokenizer::from_file(tokenizer_path.string()), tokenizer_path.string());

  ValidationData data{dir, train::PackedTokens::read(tokens_path.string()), {}};
  const train::PackedTokens& t = data.tokens;
  if (t.vocab_size() != tokenizer.vocab_size())
    fail(tokens_path.string(), "tokens of the model's tokenizer (vocab_size " + std::to_string(tokenizer.vocab_size()) + ")",
         "vocab_size " + std::to_string(t.vocab_size()));
  if (int64_t(t.vocab_size()) > config.vocab_size)
    fail(tokens_path.string(), "ids below the model's vocab_size " + std::to_string(config.vocab_size),
         "a vocabulary of " + std::to_string(t.vocab_size()));
  if (t.size() < 2) fail(tokens_path.string(), "at least 2 tokens", std::to_string(t.size()));
  if (texts) data.texts = read_texts(root / "validation.jsonl");
  return data;
}

std::vector<int> validation_sequence(const train::PackedTokens& tokens, int64_t length, int64_t k) {
  const std::span<const uint32_t> all = tokens.tokens();
  const size_t from = size_t(k * length), to = from + size_t(length) + 1;
  if (to > all.size())
    fail("validation sequence " + std::to_string(k), "tokens up to " + std::to_string(to), std::to_string(all.size()));
  return std::vector<int>(all.begin() + ptrdiff_t(from), all.begin() + ptrdiff_t(to));
}

int64_t sequences_in(const train::PackedTokens& tokens, int64_t tokens_used, int64_t length) {
  const int64_t n = std::min<int64_t>(tokens_used, int64_t(tokens.size()));
  return n < length + 1 ? 0 : (n - 1) / length;
}

}  // namespace dsv41::eval
