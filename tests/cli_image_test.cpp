// Images on the command line (docs/vision.md): `dsv41 generate --image PATH` and `/image PATH` in
// `dsv41 chat`, on a random checkpoint of the tiny-vision preset written by `dsv41 init-random`.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "image_writers.h"
#include "test_util.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::run_dsv41;

constexpr int kImageTokenId = 1020;  // the tiny presets'

class CliImages : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("cli_images");
    fs::create_directories(dir_->path());
    const test::Outcome init = run_dsv41("init-random --preset tiny-vision --seed 2 --out " + model());
    ASSERT_EQ(init.status, 0) << init.output;
    // 90 x 130 random pixels: under the tiny vision config a 4 x 3 token grid, a span of 18.
    std::vector<uint8_t> raw(90 * 130 * 3);
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = uint8_t(i * 2654435761u >> 24);
    const std::vector<uint8_t> png = test::write_png(test::PngSpec(90, 130), raw);
    std::ofstream(picture(), std::ios::binary).write(reinterpret_cast<const char*>(png.data()), std::streamsize(png.size()));
    std::ofstream(path("not-an-image.png")) << "just some text";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string path(const std::string& name) { return (*dir_ / name).string(); }
  static std::string model() { return path("tiny-vision"); }
  static std::string picture() { return path("picture.png"); }
  static test::TempDir* dir_;
};
test::TempDir* CliImages::dir_ = nullptr;

// The span of 18 image ids, once, where the prompt text has no placeholder: first.
TEST_F(CliImages, GenerateTakesImages) {
  const test::Outcome r = run_dsv41("generate --model " + model() + " --prompt \"Describe it.\" --image " + picture() +
                                    " --max-tokens 2 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j["image_tokens"], 18);
  const std::vector<int> ids = j["prompt_ids"];
  const auto first = std::find(ids.begin(), ids.end(), kImageTokenId);
  ASSERT_NE(first, ids.end()) << r.output;
  EXPECT_LE(first - ids.begin(), 1) << "the image before the text (a BOS at most before it)";
  EXPECT_EQ(std::count(ids.begin(), ids.end(), kImageTokenId), 18);
  EXPECT_TRUE(std::all_of(first, first + 18, [](int id) { return id == kImageTokenId; }));
  EXPECT_EQ(j["generated_ids"].size(), 2u);

  // Two placeholders for one image, a file that is no image, --image with --ids: refused by name.
  const test::Outcome two = run_dsv41("generate --model " + model() + " --prompt \"<｜deepseek_image｜> and <｜deepseek_image｜>\" --image " +
                                      picture() + " --max-tokens 1");
  EXPECT_NE(two.status, 0);
  EXPECT_NE(two.output.find("expected 1 image placeholders <｜deepseek_image｜>, one per image, found 2"), std::string::npos) << two.output;
  const test::Outcome bad = run_dsv41("generate --model " + model() + " --prompt hi --image " + path("not-an-image.png"));
  EXPECT_NE(bad.status, 0);
  EXPECT_NE(bad.output.find("not-an-image.png: image: expected PNG or JPEG data"), std::string::npos) << bad.output;
  const test::Outcome ids_too = run_dsv41("generate --model " + model() + " --ids 1,2 --image " + picture());
  EXPECT_NE(ids_too.status, 0);
}

// /image adds an image to the next turn; the conversation keeps it, and the second turn continues
// the first on the device (its image included). A bad file is refused and the conversation goes on.
TEST_F(CliImages, ChatTakesImages) {
  std::ofstream(path("turns.txt")) << "/image " << path("not-an-image.png") << "\n/image " << picture()
                                   << "\nWhat is this?\nAnd the colours?\n";
  const test::Outcome r = run_dsv41("chat --model " + model() + " --json --max-tokens 3 < " + path("turns.txt"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::istringstream lines(r.output);
  std::vector<json> out;
  for (std::string line; std::getline(lines, line);) out.push_back(json::parse(line));
  ASSERT_EQ(out.size(), 3u) << r.output;
  EXPECT_NE(out[0]["error"].get<std::string>().find("expected PNG or JPEG data"), std::string::npos) << out[0];
  EXPECT_EQ(out[1]["image_tokens"], 18);
  EXPECT_EQ(out[2]["image_tokens"], 18);
  EXPECT_GE(out[2]["device_tokens"].get<int64_t>(), out[1]["prompt_tokens"].get<int64_t>()) << out[2];
}

}  // namespace
}  // namespace dsv41
