#include "cli/model_dir.h"

#include <filesystem>

namespace dsv41::cli {

ModelDir load_model_dir(const std::string& dir) {
  ModelDir m;
  m.dir = dir;
  m.model = Model::load(dir);
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    m.tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
    if (std::optional<int> eos = config_eos_id(dir, *m.tokenizer)) m.stop_ids.push_back(*eos);
  }
  return m;
}

}  // namespace dsv41::cli
