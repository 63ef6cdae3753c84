// The dsv41 command as a user runs it: output, exit status, and refusals that name the problem.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct Outcome {
  int status;
  std::string output;  // stdout and stderr together
};

Outcome run_dsv41(const std::string& args) {
  std::string cmd = std::string(DSV41_BINARY) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace

TEST(Cli, InspectJsonOfTheReleasedModel) {
  Outcome r = run_dsv41("inspect --preset deepseek-v4.1-flash --json");
  ASSERT_EQ(r.status, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_EQ(j["kv"]["global_bytes_per_token"], 890);
  for (const char* key : {"backbone", "engram", "active_prefill", "active_decode"}) EXPECT_TRUE(j["params"].contains(key)) << key;
  EXPECT_TRUE(j["kv"].contains("swa_bytes_per_sequence"));
  for (const char* ctx : {"4096", "32768", "131072", "1048576"}) EXPECT_TRUE(j["decode_flops"]["per_token"].contains(ctx)) << ctx;
  EXPECT_TRUE(j["decode_flops"].contains("ratio_1m_4k"));
  EXPECT_EQ(j["prefill_flops"]["prompt_tokens"], 32768);
  EXPECT_TRUE(j["prefill_flops"].contains("default_over_exact"));
}

TEST(Cli, InitRandomThenInspectTheCheckpoint) {
  dsv41::test::TempDir dir("cli_test");
  Outcome w = run_dsv41("init-random --preset tiny --out " + dir.string() + " --seed 3 --quantized");
  ASSERT_EQ(w.status, 0) << w.output;
  Outcome r = run_dsv41("inspect --model " + dir.string());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("every one as the config expects"), std::string::npos) << r.output;
  Outcome again = run_dsv41("init-random --preset tiny --out " + dir.string());
  EXPECT_NE(again.status, 0) << "overwrote an existing checkpoint";
}

TEST(Cli, RefusesATruncatedCheckpoint) {
  dsv41::test::TempDir dir("cli_test");
  ASSERT_EQ(run_dsv41("init-random --preset tiny --out " + dir.string()).status, 0);
  fs::path file = dir / "model.safetensors";
  fs::resize_file(file, fs::file_size(file) - 100);
  Outcome r = run_dsv41("inspect --model " + dir.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("model.safetensors"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
}

TEST(Cli, RefusesAConfigWithTheWrongNumberOfRatios) {
  dsv41::test::TempDir dir("cli_test");
  ASSERT_EQ(run_dsv41("init-random --preset tiny --out " + dir.string()).status, 0);
  json config = json::parse(std::ifstream(dir / "config.json"));
  config["compress_ratios"].erase(0);
  std::ofstream(dir / "config.json") << config.dump();
  Outcome r = run_dsv41("inspect --model " + dir.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("'compress_ratios': expected 9 entries (n_layers 8 + n_mtp_layers 1), found 8 entries"),
            std::string::npos)
      << r.output;
}

TEST(Cli, UsageErrorsSayWhatIsExpected) {
  Outcome none = run_dsv41("inspect");
  EXPECT_NE(none.status, 0);
  EXPECT_NE(none.output.find("--preset P or --model DIR"), std::string::npos) << none.output;
  Outcome bad = run_dsv41("inspect --preset nope");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("deepseek-v4.1-flash"), std::string::npos) << bad.output;
}

// The reference's greedy continuation of fixture v41-tiny's prompt0 (its README), reproduced end
// to end by the command: tokenizer-derived Engram vocabulary, hashing, forward, argmax.
TEST(Cli, GenerateReproducesTheReferenceGreedyContinuation) {
  const std::string model = std::string(DSV41_TEST_DATA) + "/fixtures/v41-tiny";
  Outcome r = run_dsv41("generate --model " + model + " --ids 0,476,506,265,84 --max-tokens 9 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_EQ(j["generated_ids"], json({188, 160, 537, 96, 110, 69, 296, 149, 142}));
  EXPECT_EQ(j["prompt_ids"], json({0, 476, 506, 265, 84}));
  EXPECT_TRUE(j["timing"].contains("decode_tokens_per_second"));
}

TEST(Cli, GenerateStreamsTextFromARandomCheckpoint) {
  dsv41::test::TempDir dir("cli_test");
  ASSERT_EQ(run_dsv41("init-random --preset tiny --out " + dir.string() + " --quantized").status, 0);
  Outcome r = run_dsv41("generate --model " + dir.string() + " --prompt \"In the beginning\" --max-tokens 6");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("generated, default mode; prefill"), std::string::npos) << r.output;
  // Sampling with a seed is reproducible.
  const std::string sample = "generate --model " + dir.string() + " --ids 0,5,6 --max-tokens 8 --temperature 0.9 --top-k 50 --seed 7 --json";
  EXPECT_EQ(json::parse(run_dsv41(sample).output)["generated_ids"], json::parse(run_dsv41(sample).output)["generated_ids"]);
  Outcome bad = run_dsv41("generate --model " + dir.string() + " --ids 0,x");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("comma-separated token ids"), std::string::npos) << bad.output;
}
