// `dsv41 train`'s configuration (src/train/trainer/train_config.h): the three forms of "model", the
// defaults, the written configuration reading back to the same values, and bad input refused
// naming the key, what was expected and what was found.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../../error_of.h"
#include "train/trainer/train_config.h"

namespace dsv41::train {
namespace {

using json = nlohmann::json;

TrainConfig parse(const json& j) { return parse_train_config(j.dump(), "run.json", "/base"); }

TEST(TrainConfig, TheModelIsAPresetAPresetWithChangesOrAConfig) {
  const TrainConfig named = parse({{"model", "tiny"}, {"data", "data"}});
  EXPECT_EQ(to_official_json(named.model), to_official_json(preset("tiny")));
  EXPECT_EQ(named.data_dir, "/base/data");
  EXPECT_EQ(named.out_dir, "") << "--out may supply it";
  EXPECT_EQ(named.seq_len, 256);
  EXPECT_EQ(named.batch_size, 8);
  EXPECT_EQ(named.steps, 1000);
  EXPECT_EQ(named.optimizer.schedule.peak_lr, 2.6e-4) << "the report's";
  EXPECT_EQ(named.optimizer.adamw.eps, 1e-20f);

  const TrainConfig changed =
      parse({{"model", {{"preset", "tiny"}, {"vocab_size", 512}, {"image_token_id", 500}, {"dspark_noise_token_id", 400},
                       {"engram_compressed_vocab_size", 512}}},
             {"data", "/abs/data"},
             {"out", "../runs/a"}});
  Config want = preset("tiny");
  want.vocab_size = 512;
  want.image_token_id = 500;
  want.dspark_noise_token_id = 400;
  want.engram_compressed_vocab_size = 512;
  EXPECT_EQ(to_official_json(changed.model), to_official_json(want));
  EXPECT_EQ(changed.data_dir, "/abs/data");
  EXPECT_EQ(changed.out_dir, "/runs/a");

  const TrainConfig whole = parse({{"model", json::parse(to_official_json(want))}, {"data", "d"}});
  EXPECT_EQ(to_official_json(whole.model), to_official_json(want));
}

TEST(TrainConfig, TheWrittenConfigurationReadsBackTheSameValues) {
  const json j = {{"model", "tiny"},
                  {"data", "d"},
                  {"out", "o"},
                  {"seq_len", 64},
                  {"batch_size", 3},
                  {"steps", 77},
                  {"seed", 12345678901234ull},
                  {"init_std", 0.02},
                  {"schedule", {{"peak_lr", 3e-3}, {"warmup_steps", 7}, {"decay_start", 50}, {"decay_steps", 20}, {"final_ratio", 0.2}}},
                  {"muon", {{"momentum", 0.9}, {"weight_decay", 0.05}, {"update_rms", 0.2}}},
                  {"adamw", {{"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-8}, {"weight_decay", 0.01}}},
                  {"sinkhorn", {{"momentum", 0.9}, {"steps", 5}, {"tau", 1e-2}, {"eps", 1e-12}, {"lr_correction", 0.3}}},
                  {"expert_bias_rate", 2e-3},
                  {"indexer_loss_weight", 0.5},
                  {"dspark", {{"loss_weight", 0.25}, {"blocks", 5}}},
                  {"qat", {{"kv_fp4", true}, {"swa_fp8", false}, {"mxfp4_indexer", true}}},
                  {"log_interval", 5},
                  {"validation_interval", 25},
                  {"validation_tokens", 4096},
                  {"checkpoint_interval", 50},
                  {"keep_checkpoints", 2}};
  const TrainConfig a = parse(j);
  EXPECT_EQ(a.seed, 12345678901234ull);
  EXPECT_EQ(a.optimizer.muon.momentum, 0.9f);
  EXPECT_EQ(a.optimizer.sinkhorn.steps, 5);
  EXPECT_TRUE(a.qat.kv_fp4 && !a.qat.swa_fp8 && a.qat.mxfp4_indexer);
  EXPECT_EQ(a.dspark_loss_weight, 0.25);
  EXPECT_EQ(a.dspark_blocks, 5);
  EXPECT_TRUE(a.trains_dspark());
  const std::string written = train_config_json(a);
  const json w = json::parse(written);
  EXPECT_EQ(w["muon"]["momentum"], 0.9) << "floats written as they were given";
  EXPECT_EQ(w["data"], "/base/d");
  // Read back from anywhere (the paths are absolute now), the same configuration.
  EXPECT_EQ(train_config_json(parse_train_config(written, "written", "/elsewhere")), written);
}

// Each bad input, and what its message must say (after "run.json: ").
TEST(TrainConfig, BadInputIsRefusedByName) {
  const json base = {{"model", "tiny"}, {"data", "d"}};
  auto with = [&](const char* key, const json& value) {
    json j = base;
    j[key] = value;
    return j;
  };
  json no_model = base;
  no_model.erase("model");
  json no_data = base;
  no_data.erase("data");
  const std::vector<std::pair<json, std::string>> cases = {
      {with("stepz", 10), "key 'stepz': expected a key of the training configuration (docs/training.md), found an unknown key (value 10)"},
      {with("schedule", {{"peak", 1}}), "key 'schedule.peak': expected a key of the training configuration"},
      {with("steps", "10"), "key 'steps': expected an integer in [1, 1099511627776], found \"10\""},
      {with("steps", 2.5), "key 'steps': expected an integer in [1, 1099511627776], found 2.5"},
      {with("batch_size", 0), "key 'batch_size': expected an integer in [1, 1048576], found 0"},
      {with("seed", -1), "key 'seed': expected an integer in [0, 9223372036854775807], found -1"},
      {with("seq_len", 5000), "key 'seq_len': expected at most the model's max_seq_len (4096), found 5000"},
      {no_model, "key 'model': expected the model (a preset name or a config.json object), found no such key"},
      {no_data, "key 'data': expected the directory of `dsv41 data build`, found no such key"},
      {with("data", 3), "key 'data': expected a directory path, found 3"},
      {with("model", "huge"), "key 'model': expected a preset name ("},
      {with("model", 5), "key 'model': expected a preset name ("},
      {with("model", {{"preset", "tiny"}, {"dimm", 3}}), "key 'dimm': expected a key dsv41 implements, found an unknown key"},
      {with("model", {{"preset", "tiny"}, {"dim", "wide"}}), "key 'dim': expected an integer in [1, 1048576], found \"wide\""},
      {with("model", "deepseek-v4.1-flash"), "key 'model': expected a text model (vision_n_layers 0)"},
      {with("schedule", 3), "key 'schedule': expected a JSON object, found 3"},
      {with("schedule", {{"peak_lr", 0}}), "key 'schedule.peak_lr': expected a positive number, found 0"},
      {with("schedule", {{"warmup_steps", 10}, {"decay_start", 5}, {"decay_steps", 3}}),
       "key 'schedule.decay_start': expected at least warmup_steps (10) when decay_steps > 0, found 5"},
      {with("adamw", {{"beta1", 1.0}}), "key 'adamw.beta1': expected a number in [0, 1), found 1.0"},
      {with("sinkhorn", {{"steps", 10}}), "key 'sinkhorn.steps': expected an odd number (the last step normalizes the rows), found 10"},
      {with("qat", {{"kv_fp4", 1}}), "key 'qat.kv_fp4': expected true or false, found 1"},
      {with("dspark", {{"loss_weight", -1}}), "key 'dspark.loss_weight': expected a number >= 0, found -1"},
      {with("dspark", {{"blocks", 1.5}}), "key 'dspark.blocks': expected an integer in [0, 1048576], found 1.5"},
      {with("dspark", {{"weight", 1}}), "key 'dspark.weight': expected a key of the training configuration"},
      {with("validation_interval", -5), "key 'validation_interval': expected an integer in [0, 1099511627776], found -5"},
      {json::array(), "expected a JSON object, found []"},
  };
  for (const auto& [j, message] : cases) {
    const std::string error = test::error_of([&] { parse(j); });
    EXPECT_NE(error.find("run.json"), std::string::npos) << j.dump() << " -> " << error;
    EXPECT_NE(error.find(message), std::string::npos) << j.dump() << "\n  error: " << error << "\n  wanted: " << message;
  }
  EXPECT_NE(test::error_of([] { parse_train_config("{\"model\": ", "run.json", "/"); }).find("run.json: expected valid JSON"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { load_train_config("/nonexistent/run.json"); }).find("no such file"), std::string::npos);
}

}  // namespace
}  // namespace dsv41::train
