#include "model/random_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "base/error.h"
#include "model/engram_compress.h"
#include "model/json_document.h"
#include "model/layout_checkpoint.h"
#include "model/random_tokenizer.h"
#include "model/random_weights.h"
#include "model/safetensors.h"
#include "model/tokenizer/tokenizer.h"

namespace dsv41 {

Config random_checkpoint_config(const Config& config, bool quantized, const Tokenizer& tokenizer) {
  Config c = config;
  c.dtype = quantized ? "fp8" : "bf16";
  c.expert_dtype = quantized ? std::optional<std::string>("fp4") : std::nullopt;
  const int64_t ids = int64_t(tokenizer.vocab_size());
  // Every id the tokenizer can produce must have an embedding row.
  if (ids > c.vocab_size)
    fail(c.source + ": tokenizer", "at most vocab_size = " + std::to_string(c.vocab_size) + " ids",
         std::to_string(ids) + " ids");
  if (c.has_engram()) {
    // The Engram hasher maps the pad id through the tokenizer's compressed vocabulary.
    if (c.engram_pad_id >= ids)
      fail(c.source + ": engram_pad_id", "an id of the tokenizer (below " + std::to_string(ids) + ")",
           std::to_string(c.engram_pad_id));
    // Engram hashes over the compressed vocabulary of the checkpoint's own tokenizer.
    c.engram_compressed_vocab_size = engram_compress_vocabulary(tokenizer).size;
  }
  return c;
}

Config random_checkpoint_config(const Config& config, bool quantized) {
  return random_checkpoint_config(config, quantized, checkpoint_tokenizer(config, "").tokenizer);
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a readable file", std::filesystem::exists(path) ? "an unreadable file" : "no such file");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TokenizerFiles checkpoint_tokenizer(const Config& config, const std::string& dir) {
  if (dir.empty()) {
    std::string json = random_tokenizer_json(config.vocab_size);
    Tokenizer tokenizer = Tokenizer::from_json(json, "random tokenizer");
    return {std::move(json), random_tokenizer_config_json(), std::move(tokenizer)};
  }
  if (!std::filesystem::is_directory(dir))
    fail(dir, "a directory holding tokenizer.json and tokenizer_config.json",
         std::filesystem::exists(dir) ? "not a directory" : "no such directory");
  const std::string json_path = dir + "/tokenizer.json", config_path = dir + "/tokenizer_config.json";
  std::string json = read_text(json_path), tokenizer_config = read_text(config_path);
  // The tokenizer config is copied, not interpreted here; but the loaders read its eos_token, so a
  // file that is not a JSON object would only fail later, at serving time.
  if (!parse_json(tokenizer_config, config_path).is_object()) fail(config_path, "a JSON object", "something else");
  Tokenizer tokenizer = Tokenizer::from_json(json, json_path);
  return {std::move(json), std::move(tokenizer_config), std::move(tokenizer)};
}

void write_random_checkpoint(const Config& config, const std::string& dir, const RandomCheckpointOptions& opt) {
  const TokenizerFiles tokenizer = checkpoint_tokenizer(config, opt.tokenizer_dir);
  RandomWeightsOptions weights{opt.seed, int64_t(tokenizer.tokenizer.vocab_size()), opt.max_shard_bytes, opt.progress, {}};
  weights.files = {{"tokenizer.json", tokenizer.tokenizer_json}, {"tokenizer_config.json", tokenizer.tokenizer_config_json}};
  write_random_weights(random_checkpoint_config(config, opt.quantized, tokenizer.tokenizer), dir, weights);
}

void write_layout_checkpoint_with_tokenizer(const Config& config, const std::string& dir, const RandomCheckpointOptions& opt) {
  const TokenizerFiles tokenizer = checkpoint_tokenizer(config, opt.tokenizer_dir);
  const Config c = random_checkpoint_config(config, /*quantized=*/true, tokenizer.tokenizer);
  validate(c);
  std::filesystem::create_directories(dir);
  write_text_atomically(dir + "/tokenizer.json", tokenizer.tokenizer_json);
  write_text_atomically(dir + "/tokenizer_config.json", tokenizer.tokenizer_config_json);
  write_layout_checkpoint(c, dir);  // config.json last
}

}  // namespace dsv41
