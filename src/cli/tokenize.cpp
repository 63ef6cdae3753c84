// dsv41 tokenize (--model DIR | --tokenizer FILE) [--ids] TEXT
//
// Encodes TEXT with a tokenizer.json (DIR/tokenizer.json with --model). With --ids it prints
// the ids as one JSON array, special tokens included as the tokenizer's post-processor adds
// them; without, one line per token: its id, its string in the vocabulary, and the text it
// decodes to.
#include <fmt/core.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41::cli {

void add_tokenize(CLI::App& app) {
  struct Args {
    std::string model, tokenizer, text;
    bool ids = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Encode text with a tokenizer.json (docs/tokenizer.md)");
  auto* m = cmd->add_option("--model", args->model, "Model directory holding tokenizer.json");
  auto* t = cmd->add_option("--tokenizer", args->tokenizer, "A tokenizer.json file");
  m->excludes(t);
  cmd->add_flag("--ids", args->ids, "Print only the ids, as one JSON array");
  cmd->add_option("text", args->text, "The text to encode")->required();
  cmd->callback([args] {
    if (args->model.empty() && args->tokenizer.empty()) fail("tokenize", "--model DIR or --tokenizer FILE", "neither");
    std::string path =
        args->tokenizer.empty() ? (std::filesystem::path(args->model) / "tokenizer.json").string() : args->tokenizer;
    Tokenizer tok = Tokenizer::from_file(path);
    std::vector<int> ids = tok.encode(args->text);
    if (args->ids) {
      fmt::print("{}\n", nlohmann::json(ids).dump());
      return;
    }
    for (int id : ids) {
      int one[] = {id};
      // JSON strings show control characters and invalid bytes unambiguously.
      fmt::print("{:>8}  {:<24} {}{}\n", id, nlohmann::json(tok.id_to_token(id)).dump(),
                 nlohmann::json(tok.decode(one)).dump(), tok.is_special(id) ? "  (special)" : "");
    }
    fmt::print("{} tokens\n", ids.size());
  });
}

}  // namespace dsv41::cli
