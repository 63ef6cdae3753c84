// Pillow as the oracle of the image preprocessing (docs/vision.md §1, §3): what dsv41 decodes
// (decode_image) and fits to the plan (fit_image: ImageOps.pad with Pillow's bicubic resize) must
// equal, byte for byte, what Pillow gives for the same file (tests/oracle/pillow_fit.py, Debian's
// python3-pil from scripts/setup.sh). The images are random, written here with libpng and libjpeg:
// PNG of every colour type and bit depth, JPEG grey and colour, baseline and progressive; sizes
// from 1 to 700 pixels a side, planned under the released and the tiny configs.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "image_writers.h"
#include "model/image/decode.h"
#include "model/image/preprocess.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;

const fs::path kScript = fs::path(DSV41_TEST_DATA).parent_path() / "oracle" / "pillow_fit.py";
constexpr const char* kPython = "/usr/bin/python3";  // Debian's, where python3-pil installs

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

struct Case {
  std::string name;
  std::vector<uint8_t> bytes;
  VisionConfig config;
};

// A random image of one of the kinds Pillow and dsv41 both read.
std::vector<uint8_t> random_image(std::mt19937& rng, int kind, int w, int h) {
  std::uniform_int_distribution<int> byte(0, 255);
  auto noise = [&](size_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = uint8_t(byte(rng));
    return v;
  };
  // Smooth content too (a gradient), where the resampler's rounding matters most.
  auto gradient = [&](int channels) {
    std::vector<uint8_t> v(size_t(w) * size_t(h) * size_t(channels));
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < channels; ++c)
          v[(size_t(y) * size_t(w) + size_t(x)) * size_t(channels) + size_t(c)] =
              uint8_t((255 * (x + (c + 1) * y)) / std::max(1, w + (c + 1) * h - c - 2));
    return v;
  };
  const size_t n = size_t(w) * size_t(h);
  switch (kind) {
    case 0: return test::write_png({w, h}, noise(n * 3));
    case 1: return test::write_png({w, h}, gradient(3));
    case 2: return test::write_png({w, h, 8, PNG_COLOR_TYPE_RGB_ALPHA}, noise(n * 4));
    case 3: return test::write_png({w, h, 8, PNG_COLOR_TYPE_GRAY}, noise(n));
    case 4: return test::write_png({w, h, 8, PNG_COLOR_TYPE_GRAY_ALPHA}, noise(n * 2));
    case 5: return test::write_png({w, h, 16, PNG_COLOR_TYPE_RGB}, noise(n * 6));
    case 6: return test::write_png({w, h, 16, PNG_COLOR_TYPE_GRAY}, noise(n * 2));
    case 7: {  // 4-bit palette with a transparent entry
      test::PngSpec spec(w, h, 4, PNG_COLOR_TYPE_PALETTE);
      for (int i = 0; i < 16; ++i) spec.palette.push_back({uint8_t(byte(rng)), uint8_t(byte(rng)), uint8_t(byte(rng))});
      spec.trans_alpha = {0, 128};
      std::vector<uint8_t> packed(size_t((w + 1) / 2) * size_t(h));
      for (uint8_t& b : packed) b = uint8_t(byte(rng));
      return test::write_png(spec, packed);
    }
    case 8: return test::write_jpeg({w, h}, gradient(3));
    case 9: {
      test::JpegSpec spec(w, h);
      spec.quality = 75;
      spec.progressive = true;
      return test::write_jpeg(spec, noise(n * 3));
    }
    default: return test::write_jpeg({w, h, 1, JCS_GRAYSCALE}, gradient(1));
  }
}

TEST(ImagePillowOracle, DecodedAndFittedImagesEqualPillows) {
  const VisionConfig released{32, 1024, 16, 2816, 14, 10000.0, 3, 1024, 544 * 544, std::nullopt};
  const VisionConfig tiny{2, 64, 4, 96, 14, 10000.0, 3, 64, 3136, std::nullopt};
  const fs::path dir = fs::temp_directory_path() / ("dsv41_pillow_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::mt19937 rng(20);
  std::uniform_int_distribution<int> side(1, 700);
  std::vector<Case> cases;
  std::ofstream manifest(dir / "manifest.txt");
  for (int i = 0; i < 44; ++i) {
    const int kind = i % 11;
    int w = side(rng), h = side(rng);
    if (i % 4 == 3) h = 1 + h % 12;  // very wide ones: the collapse branches and big stretches
    Case c{(dir / ("image" + std::to_string(i))).string(), random_image(rng, kind, w, h), i % 2 ? tiny : released};
    std::ofstream(c.name, std::ios::binary).write(reinterpret_cast<const char*>(c.bytes.data()), std::streamsize(c.bytes.size()));
    const ImagePlan plan = plan_image(w, h, c.config);
    manifest << c.name << ' ' << plan.best_width << ' ' << plan.best_height << '\n';
    cases.push_back(std::move(c));
  }
  manifest.close();
  const std::string cmd = std::string(kPython) + " '" + kScript.string() + "' '" + (dir / "manifest.txt").string() + "' 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe)) output += buffer;
  ASSERT_EQ(::pclose(pipe), 0) << cmd << " failed (is python3-pil installed? scripts/setup.sh):\n" << output;

  for (const Case& c : cases) {
    const RgbImage image = decode_image(c.bytes.data(), c.bytes.size());
    EXPECT_EQ(image.pixels, read_bytes(c.name + ".rgb")) << c.name << " decoded";
    const RgbImage fitted = fit_image(image, plan_image(image.width, image.height, c.config), c.config);
    EXPECT_EQ(fitted.pixels, read_bytes(c.name + ".fit"))
        << c.name << " (" << image.width << " x " << image.height << " to " << fitted.width << " x " << fitted.height
        << ") fitted, Pillow " << output;
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace dsv41
