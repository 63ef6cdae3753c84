// `dsv41 train` with decoder bounded replay simulated (`bounded_replay.turns`; docs/training.md,
// "Bounded replay in training"), DSpark trained with it: save → reload → continue reproduces the run
// bit for bit — the served calls of each sequence and DSpark's anchors among their decoded rows are
// drawn from (seed, its index in the data stream) — and the switch changes the curve (exact mode's is
// another).
#include <gtest/gtest.h>
#include <omp.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "../../error_of.h"
#include "../../test_util.h"
#include "trainer_runs.h"
#include "train/trainer/trainer.h"

namespace dsv41::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::vector<double> train_losses(const std::vector<json>& curve) {
  std::vector<double> losses;
  for (const json& e : curve)
    if (e["event"] == "train") losses.push_back(e["loss"].get<double>());
  return losses;
}

TEST(TrainerReplay, ResumeReproducesTheRunBitForBit) {
  test::TempDir straight("replay_straight"), extended("replay_extended"), exact("replay_exact");
  json config = base_config(straight.path(), 4);
  config["validation_interval"] = 2;
  config["dspark"] = {{"blocks", 4}};
  config["bounded_replay"] = {{"turns", 3}};
  Trainer::start(config_of(config))->run();

  // Two steps on one thread, then resumed to four.
  config["out"] = extended.string();
  config["steps"] = 2;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Trainer::start(config_of(config))->run();
  omp_set_num_threads(threads);
  std::unique_ptr<Trainer> more = Trainer::resume(extended.string(), 4);
  EXPECT_EQ(more->step(), 2);
  more->run();

  const std::vector<json> curve = curve_of(straight.path()), resumed = curve_of(extended.path());
  ASSERT_EQ(curve.size(), 4u + 3u) << "four steps, validation at 0, 2 and 4";
  ASSERT_EQ(resumed.size(), curve.size());
  for (size_t i = 0; i < curve.size(); ++i) EXPECT_EQ(resumed[i], curve[i]) << "event " << i;
  for (const char* file : {"model.safetensors", "config.json", "resume/masters.safetensors", "resume/optimizer.state", "resume/trainer.json"})
    EXPECT_TRUE(test::read_text(extended / "step-00000004" / file) == test::read_text(straight / "step-00000004" / file)) << file;
  EXPECT_EQ(config_of(json::parse(test::read_text(straight / "train_config.json"))).replay_turns, 3);
  int drafted = 0;  // steps with a DSpark loss: some sequences have a reply long enough for a block
  for (const json& e : curve)
    if (e["event"] == "train" && e.contains("dspark_loss")) drafted += e["dspark_loss"].get<double>() > 0;
  EXPECT_GT(drafted, 0);

  // Exact mode from the same start: the same first validation (validation runs in exact mode), a
  // different training curve.
  config["out"] = exact.string();
  config["steps"] = 4;
  config["bounded_replay"] = {{"turns", 0}};
  Trainer::start(config_of(config))->run();
  const std::vector<json> plain = curve_of(exact.path());
  ASSERT_EQ(plain.size(), curve.size());
  EXPECT_EQ(plain[0], curve[0]) << "validation before the first step";
  const std::vector<double> a = train_losses(curve), b = train_losses(plain);
  ASSERT_EQ(a.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]) << "step " << i + 1;
  EXPECT_EQ(std::set<double>(a.begin(), a.end()).size(), 4u) << "a curve that moves";
}

TEST(TrainerReplay, ConfigurationRefusesWhatItCannotRun) {
  const fs::path out = "/nonexistent-out";
  json config = base_config(out, 1);
  config["bounded_replay"] = {{"turns", 2}};
  const TrainConfig both = config_of(config);  // DSpark trained under bounded replay
  EXPECT_TRUE(both.trains_dspark());
  EXPECT_EQ(both.replay_turns, 2);
  config["bounded_replay"] = {{"turns", -1}};
  std::string e = test::error_of([&] { config_of(config); });
  EXPECT_NE(e.find("bounded_replay.turns"), std::string::npos) << e;
  config["bounded_replay"] = {{"turn", 2}};
  e = test::error_of([&] { config_of(config); });
  EXPECT_NE(e.find("bounded_replay.turn"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown key"), std::string::npos) << e;
  config.erase("bounded_replay");
  EXPECT_EQ(config_of(config).replay_turns, 0);
}

}  // namespace
}  // namespace dsv41::train
