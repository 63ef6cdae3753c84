// `dsv41 train` as a user runs it: a configuration file (its relative paths taken from its own
// directory), --steps, --resume, bad input refused by name, and the checkpoint it writes served by
// `dsv41 generate` unchanged.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../../test_util.h"
#include "small_corpus.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TEST(TrainCommand, TrainsResumesAndItsCheckpointGenerates) {
  test::TempDir dir("train_command");
  test::write_small_corpus(dir / "data");
  const json config = {{"model", "tiny"},       {"data", "data"},       {"out", "run"},
                       {"seq_len", 32},         {"batch_size", 1},      {"steps", 100},
                       {"schedule", {{"peak_lr", 0.01}, {"warmup_steps", 2}}},
                       {"log_interval", 1},     {"validation_interval", 0}};
  std::ofstream(dir / "run.json") << config.dump(2);

  const test::Outcome first = test::run_dsv41("train --config " + (dir / "run.json").string() + " --steps 2");
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_NE(first.output.find("step 2: loss "), std::string::npos) << "a line per log interval on stdout: " << first.output;
  EXPECT_NE(first.output.find("done: 2 steps"), std::string::npos) << first.output;
  EXPECT_EQ(first.output.find('\r'), std::string::npos) << "no progress bar when stderr is not a terminal";
  EXPECT_TRUE(fs::exists(dir / "run/step-00000002/model.safetensors")) << "\"out\" is taken from the file's directory";

  const test::Outcome again = test::run_dsv41("train --config " + (dir / "run.json").string());
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.output.find("continue one with --resume"), std::string::npos) << again.output;

  const test::Outcome resumed = test::run_dsv41("train --resume " + (dir / "run").string() + " --steps 3");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step 3: loss "), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("step 2: loss "), std::string::npos) << "step 2 was done before: " << resumed.output;

  const test::Outcome generated =
      test::run_dsv41("generate --model " + (dir / "run/latest").string() + " --prompt 'The old dog' --max-tokens 6");
  EXPECT_EQ(generated.status, 0) << generated.output;
}

TEST(TrainCommand, BadInputIsRefusedByName) {
  test::TempDir dir("train_command_bad");
  fs::create_directories(dir.path());
  std::ofstream(dir / "bad.json") << R"({"model": "tiny", "data": "data", "out": "run", "stepz": 5})";
  const test::Outcome bad = test::run_dsv41("train --config " + (dir / "bad.json").string());
  EXPECT_EQ(bad.status, 1);
  EXPECT_NE(bad.output.find("bad.json: key 'stepz': expected a key of the training configuration"), std::string::npos) << bad.output;

  std::ofstream(dir / "nodata.json") << R"({"model": "tiny", "data": "missing", "out": "run"})";
  const test::Outcome nodata = test::run_dsv41("train --config " + (dir / "nodata.json").string());
  EXPECT_EQ(nodata.status, 1);
  EXPECT_NE(nodata.output.find("missing"), std::string::npos) << nodata.output;
  EXPECT_FALSE(fs::exists(dir / "run")) << "nothing written for a run that cannot start";

  EXPECT_NE(test::run_dsv41("train").status, 0) << "--config or --resume";
  EXPECT_NE(test::run_dsv41("train --config a.json --resume b").status, 0);
  EXPECT_NE(test::run_dsv41("train --resume b --out c").status, 0);
}

}  // namespace
}  // namespace dsv41
