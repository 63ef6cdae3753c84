#include "cli/model_dir.h"

#include <filesystem>

namespace dsv41::cli {

ModelDir load_model_dir(const std::string& dir, Device device) {
  ModelDir m;
  m.dir = dir;
  check_device(device);
  m.model = Model::load(dir);
  m.executor = make_executor(*m.model, device);
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    m.tokenizer = Tokenizer::from_file(dir + "/tokenizer.json");
    if (std::optional<int> eos = config_eos_id(dir, *m.tokenizer)) m.stop_ids.push_back(*eos);
  }
  return m;
}

}  // namespace dsv41::cli
