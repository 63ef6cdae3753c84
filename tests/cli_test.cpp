// The dsv41 command as a user runs it: output, exit status, and refusals that name the problem.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "fixture.h"
#include "serve_process.h"
#include "test_util.h"

using dsv41::test::Outcome;
using dsv41::test::run_dsv41;

using json = nlohmann::json;
namespace fs = std::filesystem;

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

// --ranks N: what each rank holds of the model cut as model.py cuts it (docs/parallel.md); a world
// that does not divide the heads is refused by name.
TEST(Cli, InspectPerRank) {
  Outcome r = run_dsv41("inspect --preset deepseek-v4.1-flash --json --ranks 8");
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = json::parse(r.output)["ranks"];
  EXPECT_EQ(j["world"], 8);
  ASSERT_EQ(j["weight_bytes"].size(), 8u);
  const int64_t total = j["weight_bytes"][0]["total"];
  EXPECT_GT(total, 50'000'000'000);  // of ~510 GB: an eighth of the experts and tables, the rest whole
  EXPECT_LT(total, 80'000'000'000);
  Outcome text = run_dsv41("inspect --preset deepseek-v4.1-flash --ranks 8");
  EXPECT_NE(text.output.find("per rank    8 ranks (model.py's cut): rank 0 holds backbone"), std::string::npos) << text.output;
  Outcome bad = run_dsv41("inspect --preset deepseek-v4.1-flash --ranks 3");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("expected n_heads divisible by the world size, found 64"), std::string::npos) << bad.output;
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

// --help shows each option's default: the value itself, or the default's words where a sentinel
// stands for one (a 0 that means "10% of RAM" shows no "=0").
TEST(Cli, HelpShowsTheDefaults) {
  Outcome serve = run_dsv41("serve --help");
  EXPECT_EQ(serve.status, 0);
  for (const char* shown : {"=127.0.0.1", "=8080", "--max-running INT:INT in [1 - 4096]=8", "=auto", "--swa-ttl FLOAT:POSITIVE=300"})
    EXPECT_NE(serve.output.find(shown), std::string::npos) << shown << " in\n" << serve.output;
  for (const char* hidden : {"--host-cache-mb FLOAT:NONNEGATIVE=", "--kv-budget-gb FLOAT:NONNEGATIVE=", "=-1"})
    EXPECT_EQ(serve.output.find(hidden), std::string::npos) << hidden << " in\n" << serve.output;
  Outcome generate = run_dsv41("generate --help");
  EXPECT_NE(generate.output.find("--max-tokens INT:INT in [1 - 1048576]=128"), std::string::npos) << generate.output;
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

// The same continuation with the model cut over two ranks (docs/parallel.md: the whole model's up
// to summation order; the fixture's README lists no near-tie in these steps), also with DSpark's
// drafts; three ranks do not divide its four heads.
TEST(Cli, GenerateOverTwoRanksReproducesTheReferenceGreedyContinuation) {
  const std::string model = std::string(DSV41_TEST_DATA) + "/fixtures/v41-tiny";
  Outcome r = run_dsv41("generate --model " + model + " --ids 0,476,506,265,84 --max-tokens 9 --ranks 2 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(json::parse(r.output)["generated_ids"], json({188, 160, 537, 96, 110, 69, 296, 149, 142}));
  Outcome three = run_dsv41("generate --model " + model + " --ids 0,476 --max-tokens 2 --ranks 3");
  EXPECT_NE(three.status, 0);
  EXPECT_NE(three.output.find("expected n_heads divisible by the world size, found 4"), std::string::npos) << three.output;
  Outcome spec = run_dsv41("generate --model " + model + " --ids 0,476,506,265,84 --max-tokens 9 --ranks 2 --speculative dspark --json");
  ASSERT_EQ(spec.status, 0) << spec.output;
  EXPECT_EQ(json::parse(spec.output)["generated_ids"], json({188, 160, 537, 96, 110, 69, 296, 149, 142}));
  EXPECT_FALSE(json::parse(spec.output)["drafts"].empty());
}

// The same continuation with DSpark's drafts verified by the target (greedy speculation emits
// plain greedy decoding's tokens), each draft listed: its anchor's position, the anchor and the γ
// drafts, how many were accepted.
TEST(Cli, GenerateSpeculativeReproducesTheGreedyContinuation) {
  const std::string model = std::string(DSV41_TEST_DATA) + "/fixtures/v41-tiny";
  Outcome r = run_dsv41("generate --model " + model + " --ids 0,476,506,265,84 --max-tokens 9 --speculative dspark --json");
  ASSERT_EQ(r.status, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_EQ(j["generated_ids"], json({188, 160, 537, 96, 110, 69, 296, 149, 142}));
  ASSERT_FALSE(j["drafts"].empty()) << r.output;
  int64_t position = 5;  // the first anchor follows the prompt
  for (const json& d : j["drafts"]) {
    EXPECT_EQ(d["position"].get<int64_t>(), position) << d;
    ASSERT_EQ(d["tokens"].size(), 5u) << d;  // v41-tiny: γ = 4
    const int accepted = d["accepted"].get<int>();
    EXPECT_TRUE(accepted >= 0 && accepted <= 4) << d;
    position += accepted + 1;
  }
  // Speculative sampling: a seed gives one output.
  const std::string sampled = "generate --model " + model + " --ids 0,1 --max-tokens 12 --speculative dspark --temperature 0.8 --seed 3 --json";
  Outcome a = run_dsv41(sampled), b = run_dsv41(sampled);
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_EQ(json::parse(a.output)["generated_ids"], json::parse(b.output)["generated_ids"]);
  EXPECT_EQ(json::parse(a.output)["generated_ids"].size(), 12u);
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

// dsv41 chat keeps one session across turns: the second turn reuses the first turn's prompt and
// reply (the running sequence), and says so.
TEST(Cli, ChatReusesEarlierTurns) {
  dsv41::test::TempDir dir("cli_chat");
  fs::create_directories(dir.path());
  std::ofstream(dir / "turns.txt") << "Tell me about the sea.\n\nAnd the mountains?\n";
  Outcome r = run_dsv41("chat --model " DSV41_TEST_DATA "/fixtures/v41-tiny --json --max-tokens 6 < " + (dir / "turns.txt").string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream lines(r.output);
  std::vector<json> turns;
  for (std::string line; std::getline(lines, line);) turns.push_back(json::parse(line));
  ASSERT_EQ(turns.size(), 2u) << r.output;  // the empty line is not a turn
  EXPECT_EQ(turns[0]["cached_tokens"], 0);
  EXPECT_EQ(turns[0]["computed_tokens"], turns[0]["prompt_tokens"]);
  const int64_t first_turn = turns[0]["prompt_tokens"].get<int64_t>() + turns[0]["generated_tokens"].get<int64_t>();
  EXPECT_GT(turns[1]["prompt_tokens"].get<int64_t>(), first_turn);
  EXPECT_GE(turns[1]["cached_tokens"].get<int64_t>(), turns[0]["prompt_tokens"].get<int64_t>()) << turns[1];
  EXPECT_EQ(turns[1]["cached_tokens"].get<int64_t>() + turns[1]["computed_tokens"].get<int64_t>(), turns[1]["prompt_tokens"]);
}

// A turn the context cannot hold is refused with a reason, and the conversation goes on from the
// turns before it; one that fits with a shorter reply gets that reply. Ctrl-C (SIGINT) during a
// reply ends the reply, not the conversation.
TEST(Cli, ChatRefusesATooLongTurnAndGoesOn) {
  dsv41::test::TempDir dir("cli_chat");
  fs::create_directories(dir.path());
  {
    std::ofstream turns(dir / "turns.txt");
    turns << "Tell me about the sea.\n";
    for (int i = 0; i < 6000; ++i) turns << "word ";  // ~18,000 tokens: past v41-tiny's 4,096
    turns << "\nAnd the mountains?\n";
  }
  Outcome r = run_dsv41("chat --model " DSV41_TEST_DATA "/fixtures/v41-tiny --json --max-tokens 6 < " + (dir / "turns.txt").string());
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream lines(r.output);
  std::vector<json> turns;
  for (std::string line; std::getline(lines, line);) turns.push_back(json::parse(line));
  ASSERT_EQ(turns.size(), 3u) << r.output;
  EXPECT_EQ(turns[1]["turn"], 2);
  EXPECT_NE(turns[1]["error"].get<std::string>().find("the context holds 4096"), std::string::npos) << turns[1];
  EXPECT_EQ(turns[2]["turn"], 3);
  EXPECT_EQ(turns[2]["generated_tokens"], 6);
  // The third turn's prompt holds the first turn and itself, not the refused one.
  EXPECT_LT(turns[2]["prompt_tokens"].get<int64_t>(), 100) << turns[2];
  EXPECT_GE(turns[2]["cached_tokens"].get<int64_t>(), turns[0]["prompt_tokens"].get<int64_t>()) << turns[2];
}

TEST(Cli, ChatInterruptEndsTheReplyNotTheConversation) {
  dsv41::test::TempDir dir("cli_chat");
  fs::create_directories(dir.path());
  const fs::path fifo = dir / "in", out = dir / "out.txt";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const int in = open(fifo.c_str(), O_RDONLY), o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600),
              null = open("/dev/null", O_WRONLY);
    dup2(in, 0), dup2(o, 1), dup2(null, 2);
    execl(DSV41_BINARY, DSV41_BINARY, "chat", "--model", DSV41_TEST_DATA "/fixtures/v41-tiny", "--max-tokens", "1500", "--ignore-eos",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const int w = open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(w, 0);
  const std::string first = "Tell me a long story.\n", second = "Short, please.\n";
  ASSERT_EQ(write(w, first.data(), first.size()), ssize_t(first.size()));
  // The reply streams to stdout token by token: once some has come, the reply is under way.
  for (int i = 0; i < 6000 && (!fs::exists(out) || fs::file_size(out) < 16); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kill(pid, SIGINT);
  ASSERT_EQ(write(w, second.data(), second.size()), ssize_t(second.size()));
  close(w);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string output = dsv41::test::read_text(out);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << output;
  std::vector<std::string> summaries;
  for (size_t at = output.find("[turn "); at != std::string::npos; at = output.find("[turn ", at + 1))
    summaries.push_back(output.substr(at, output.find(']', at) - at));
  ASSERT_EQ(summaries.size(), 2u) << output;
  EXPECT_NE(summaries[0].find("generated, cancelled"), std::string::npos) << summaries[0];
  EXPECT_EQ(summaries[0].find("1500 generated"), std::string::npos) << summaries[0];
  EXPECT_NE(summaries[1].find("1500 generated;"), std::string::npos) << summaries[1];  // the next reply runs whole
}

// A second process finds the first one's global blocks on disk: the prompt's prefix is served
// from the persistent store (with encoder replay, its SWA pool having died with the first).
TEST(Cli, ChatServesAPrefixFromDiskAfterARestart) {
  dsv41::test::TempDir dir("cli_chat");
  fs::create_directories(dir.path());
  std::ofstream(dir / "turn.txt") << "What is the capital of France?\n";
  const std::string cmd = "chat --model " DSV41_TEST_DATA "/fixtures/v41-tiny --json --max-tokens 2 --store " +
                          (dir / "store").string() +
                          " --system 'You are a careful assistant. Answer in one short sentence, "
                          "and say so when you do not know.' < " + (dir / "turn.txt").string();
  Outcome first = run_dsv41(cmd);
  ASSERT_EQ(first.status, 0) << first.output;
  EXPECT_EQ(json::parse(first.output)["cached_tokens"], 0);
  Outcome second = run_dsv41(cmd);
  ASSERT_EQ(second.status, 0) << second.output;
  json t = json::parse(second.output);
  EXPECT_GT(t["disk_blocks"].get<int64_t>(), 0) << t;
  EXPECT_EQ(t["global_tokens"].get<int64_t>(), 64 * t["disk_blocks"].get<int64_t>());
  EXPECT_EQ(t["replayed_tokens"], 16);  // W of v41-tiny
}

// The same in exact mode: the second process adopts the blocks through the exact replay (every
// layer over 181 rows of v41-tiny), so the system prompt must reach past that.
TEST(Cli, ExactChatServesAPrefixFromDiskAfterARestart) {
  dsv41::test::TempDir dir("cli_chat");
  fs::create_directories(dir.path());
  std::ofstream(dir / "turn.txt") << "What is the capital of France?\n";
  std::string system;
  for (int i = 0; i < 24; ++i) system += "Answer in one short sentence, and say so when you do not know. ";
  const std::string cmd = "chat --model " DSV41_TEST_DATA "/fixtures/v41-tiny --exact --json --max-tokens 2 --store " +
                          (dir / "store").string() + " --system '" + system + "' < " + (dir / "turn.txt").string();
  Outcome first = run_dsv41(cmd);
  ASSERT_EQ(first.status, 0) << first.output;
  const json cold = json::parse(first.output);
  EXPECT_EQ(cold["cached_tokens"], 0);
  ASSERT_GT(cold["prompt_tokens"].get<int64_t>(), 2 * 64 + 181) << cold;
  Outcome second = run_dsv41(cmd);
  ASSERT_EQ(second.status, 0) << second.output;
  json t = json::parse(second.output);
  EXPECT_GT(t["disk_blocks"].get<int64_t>(), 0) << t;
  EXPECT_EQ(t["global_tokens"].get<int64_t>(), 64 * t["disk_blocks"].get<int64_t>());
  EXPECT_EQ(t["replayed_tokens"], 181);
  ASSERT_TRUE(cold.contains("reply")) << cold;
  EXPECT_EQ(t["reply"], cold["reply"]);  // exact: the same greedy reply as the cold run
}

// bench cache runs every scenario in both modes and reports the work each one did.
// bench spec on fixture v41-tiny: per batch size, plain decoding and DSpark's speculation through
// the scheduler, and at batch 1 the oracle drafter: 16 tokens after the first in 4 steps of γ + 1
// = 5 (the last block runs past the 17 tokens: the oracle knows the reply a block further), every
// draft accepted in its first run (on the CPU a verification pass's rows are plain decoding's bit
// for bit). DSpark's runs report their steps, drafted or plain, and their scheduler's profiles.
TEST(Cli, BenchSpecReportsEveryDrafter) {
  Outcome r = run_dsv41("bench spec --model " DSV41_TEST_DATA "/fixtures/v41-tiny --prompt-tokens 20 --tokens 17 --batches 1,2 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_EQ(j["executor"], "cpu");
  std::vector<std::pair<int, std::string>> runs;
  for (const json& run : j["runs"]) {
    runs.emplace_back(run["batch"].get<int>(), run["drafter"].get<std::string>());
    EXPECT_GT(run["output_tokens_per_s"].get<double>(), 0) << run;
    if (run["drafter"] == "oracle") {
      EXPECT_EQ(run["speculative_steps"].get<int>(), 4) << run;
      EXPECT_EQ(run["accepted_at"], json({4, 4, 4, 4})) << run;
      EXPECT_EQ(run["oracle_rounds"], 1) << run;
    }
    if (run["drafter"] == "dspark") {  // each sequence's 16 steps at most, drafted or plain; the profiles measured
      const int steps = run["speculative_steps"].get<int>() + run["plain_steps"].get<int>();
      EXPECT_GT(steps, 0) << run;
      EXPECT_LE(steps, 16 * run["batch"].get<int>()) << run;
      EXPECT_FALSE(run["verify_profile"].empty()) << run;
      EXPECT_EQ(run["plain_profile"].size(), run["batch"] == 1 ? 1u : 2u) << run;
      EXPECT_EQ(run["draft_profile"].size(), run["batch"] == 1 ? 1u : 2u) << run;  // 1, 2, ... sequences up to the batch
    }
  }
  EXPECT_EQ(runs, (std::vector<std::pair<int, std::string>>{{1, "none"}, {1, "dspark"}, {1, "oracle"}, {2, "none"}, {2, "dspark"}}));
}

// --random-weights writes the layout only and needs the executor that fills it: on the CPU the
// command is refused by name, before any run.
TEST(Cli, BenchSpecRandomWeightsNeedTheCudaExecutor) {
  Outcome r = run_dsv41("bench spec --preset tiny --random-weights 1 --device cpu --batches 1 --json");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("--random-weights: expected the CUDA executor"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("output_tokens_per_s"), std::string::npos) << r.output;
  Outcome both = run_dsv41("bench spec --model " DSV41_TEST_DATA "/fixtures/v41-tiny --random-weights 1");
  EXPECT_NE(both.status, 0);
  EXPECT_NE(both.output.find("excludes"), std::string::npos) << both.output;
}

TEST(Cli, BenchCacheReportsEveryScenario) {
  Outcome r = run_dsv41("bench cache --model " DSV41_TEST_DATA
                        "/fixtures/v41-tiny --document-tokens 200 --question-tokens 32 --reply-tokens 4 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  json j = json::parse(r.output);
  std::vector<std::string> names;
  for (const json& s : j["scenarios"]) {
    names.push_back(s["name"]);
    for (const char* key : {"ttft_ms", "tokens_computed", "tokens_cached", "tokens_replayed", "exact_ttft_ms", "exact_tokens_replayed"})
      EXPECT_TRUE(s.contains(key)) << key;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"cold", "global_swa_hit", "global_hit_swa_miss", "host_hit", "disk_hit"}));
  const json& s = j["scenarios"];
  EXPECT_EQ(s[0]["tokens_cached"], 0);
  EXPECT_EQ(s[1]["tokens_replayed"], 0);  // the SWA tail continues exactly
  EXPECT_EQ(s[1]["tokens_computed"], 32);
  for (int i : {2, 3, 4}) EXPECT_EQ(s[i]["tokens_replayed"], 16) << s[i];
  EXPECT_EQ(s[4]["disk_blocks"], 3);
  // Exact mode's global hits replay every layer over 16 + 11 * 15 = 181 rows (v41-tiny: W 16, 12 layers).
  EXPECT_EQ(s[1]["exact_tokens_replayed"], 0);
  for (int i : {2, 3, 4}) EXPECT_EQ(s[i]["exact_tokens_replayed"], 181) << s[i];
  for (int i : {2, 3, 4}) EXPECT_EQ(s[i]["exact_tokens_cached"], s[i]["tokens_cached"]) << s[i];
  // The bytes the sequence's global KV buffers hold per token are what the accounting predicts
  // from the shapes (106 B for v41-tiny; the flash-kv preset's 890 is measured in docs/benchmarks.md).
  Outcome inspect = run_dsv41("inspect --model " DSV41_TEST_DATA "/fixtures/v41-tiny --json");
  ASSERT_EQ(inspect.status, 0) << inspect.output;
  EXPECT_EQ(j["kv_bytes_per_token"].get<double>(), json::parse(inspect.output)["kv"]["global_bytes_per_token"].get<double>());
}

namespace {

using dsv41::test::ServeProcess;

}  // namespace

// The API key from the environment or a file: one on the command line is visible to every user
// in `ps`. Without the key /v1 answers 401, with it 200; an unreadable or empty file is refused.
TEST(Cli, ServeTakesTheApiKeyFromTheEnvironmentOrAFile) {
  const std::string model = "--model " + dsv41::test::fixture_dir("v41-tiny");
  {
    ServeProcess serve(model, "DSV41_API_KEY=sesame");
    ASSERT_GT(serve.port(), 0) << serve.stop().second;
    EXPECT_EQ(serve.get("/v1/models", ""), 401);
    EXPECT_EQ(serve.get("/v1/models", "sesame"), 200);
  }
  dsv41::test::TempDir dir("cli_key");
  fs::create_directories(dir.path());
  std::ofstream(dir / "key") << "open sesame\n";
  {
    ServeProcess serve(model + " --api-key-file " + (dir / "key").string(), "");
    ASSERT_GT(serve.port(), 0) << serve.stop().second;
    EXPECT_EQ(serve.get("/v1/models", "sesame"), 401);
    EXPECT_EQ(serve.get("/v1/models", "open sesame"), 200);
  }
  std::ofstream(dir / "empty") << "\n";
  for (const std::string& file : {(dir / "empty").string(), (dir / "missing").string()}) {
    ServeProcess serve(model + " --api-key-file " + file, "");
    const auto [status, output] = serve.stop();
    EXPECT_EQ(status, 1) << output;
    EXPECT_NE(output.find(file + ": expected "), std::string::npos) << output;
  }
}


// Without a usable GPU (CUDA_VISIBLE_DEVICES hides every one, or the build has no CUDA), --device
// cuda is refused before the model loads, naming what is missing; auto serves from the CPU.
TEST(Cli, DeviceCudaWithoutAGpuIsRefusedAndAutoTakesTheCpu) {
  const std::string model = "--model " + dsv41::test::fixture_dir("v41-tiny");
  const std::string refused = "--device cuda: expected a CUDA device, found ";
  {
    ServeProcess serve(model + " --device cuda", "CUDA_VISIBLE_DEVICES=");
    const auto [status, output] = serve.stop();
    EXPECT_EQ(status, 1) << output;
    EXPECT_NE(output.find(refused), std::string::npos) << output;
  }
  Outcome g = run_dsv41("generate " + model + " --ids 0,1,2 --max-tokens 1 --device cuda", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(g.status, 1) << g.output;
  EXPECT_NE(g.output.find(refused), std::string::npos) << g.output;
  Outcome bad = run_dsv41("generate " + model + " --ids 0,1,2 --device gpu");
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("--device"), std::string::npos) << bad.output;
  ServeProcess serve(model + " --device auto", "CUDA_VISIBLE_DEVICES=");
  ASSERT_GT(serve.port(), 0) << serve.stop().second;
  ASSERT_EQ(serve.get("/health", ""), 200);
  httplib::Client c("127.0.0.1", serve.port());
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("dsv41_executor_info{device=\"cpu\"} 1"), std::string::npos) << metrics->body;
}

// SIGTERM while 8 streams run: every client gets a clean end of its stream (a last chunk, then
// `data: [DONE]`), and the process says it stopped and exits 0.
TEST(Cli, SigtermEndsEveryStreamCleanlyAndExitsZero) {
  ServeProcess serve("--model " + dsv41::test::fixture_dir("v41-tiny") + " --max-running 8", "");
  ASSERT_GT(serve.port(), 0) << serve.stop().second;
  ASSERT_EQ(serve.get("/health", ""), 200);
  constexpr int kStreams = 8;
  std::vector<std::string> wires(kStreams);
  std::atomic<int> started{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i)
    clients.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", serve.port());
      c.set_read_timeout(60, 0);
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.body = json{{"model", "v41-tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 3000}, {"stream", true}, {"ignore_eos", true}}.dump();
      req.set_header("Content-Type", "application/json");
      bool counted = false;
      req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
        wires[size_t(i)].append(data, n);
        if (!counted && wires[size_t(i)].find("\"text\"") != std::string::npos) counted = true, ++started;
        return true;
      };
      c.send(req);
    });
  for (int i = 0; i < 6000 && started.load() < kStreams; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(started.load(), kStreams) << "not every stream started";
  const auto [status, output] = serve.stop();  // SIGTERM
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("dsv41: stopped"), std::string::npos) << output;
  for (int i = 0; i < kStreams; ++i) {
    const std::string& w = wires[size_t(i)];
    EXPECT_TRUE(w.ends_with("data: [DONE]\n\n")) << "stream " << i << " ended: " << w.substr(w.size() > 200 ? w.size() - 200 : 0);
    EXPECT_NE(w.find("\"finish_reason\":\"stop\""), std::string::npos) << "stream " << i;
  }
}

// The long jobs' progress lines go to stderr when it is a terminal, and only then: under a pseudo-
// terminal (script(1), util-linux) init-random draws its bar of bytes written and generate its
// loading steps; through a pipe neither writes a carriage return, and generate's JSON is the
// whole output.
TEST(Cli, ProgressBarsOnlyOnATerminal) {
  dsv41::test::TempDir dir("cli_test");
  fs::create_directories(dir.path());
  const std::string model = dsv41::test::fixture_dir("v41-tiny");
  const std::string generate = "generate --model " + model + " --ids 0,476 --max-tokens 2 --json";
  const Outcome piped = run_dsv41(generate);
  ASSERT_EQ(piped.status, 0) << piped.output;
  EXPECT_EQ(piped.output.find('\r'), std::string::npos) << piped.output;
  EXPECT_NO_THROW(json::parse(piped.output)) << piped.output;
  const Outcome written = run_dsv41("init-random --preset tiny --out " + (dir / "piped").string());
  ASSERT_EQ(written.status, 0) << written.output;
  EXPECT_EQ(written.output.find('\r'), std::string::npos) << written.output;

  // A command under a terminal of its own, its whole transcript.
  const auto on_a_terminal = [](const std::string& args) {
    const std::string cmd = "script -qec '" + std::string(DSV41_BINARY) + " " + args + "' /dev/null < /dev/null 2>&1";
    FILE* pipe = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
    EXPECT_EQ(pclose(pipe), 0) << cmd << "\n" << out;
    return out;
  };
  const std::string out = (dir / "tty").string();
  const std::string init = on_a_terminal("init-random --preset tiny --out " + out);
  EXPECT_NE(init.find("\rwriting " + out + " [#"), std::string::npos) << init;
  EXPECT_NE(init.find(" MB"), std::string::npos) << init;
  const std::string load = on_a_terminal(generate);
  for (const char* step : {"the checkpoint [", "the weights to the executor [", "the tokenizer ["})
    EXPECT_NE(load.find("\rloading " + model + ": " + step), std::string::npos) << step << "\n" << load;
}
