#pragma once
// What the commands that run a model load from its directory: the weights, the tokenizer when
// there is one, and the ids that end a reply.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/executors.h"
#include "forward/model.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41::cli {

struct ModelDir {
  std::string dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<Executor> executor;  // what the model runs on (--device)
  std::optional<Tokenizer> tokenizer;  // tokenizer.json, if present
  std::vector<int> stop_ids;           // tokenizer_config.json's eos_token, if the tokenizer knows it
  const Tokenizer* tokenizer_or_null() const { return tokenizer ? &*tokenizer : nullptr; }
};

ModelDir load_model_dir(const std::string& dir, Device device = Device::Auto);

}  // namespace dsv41::cli
