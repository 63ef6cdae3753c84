// Image decoding (src/model/image/decode.h): PNG and JPEG to RGB8 with Pillow's convert("RGB")
// semantics (docs/vision.md §1), and refusals that name what was expected and found. The inputs
// are written here with libpng and libjpeg (image_writers.h) from pixels the test chooses; the expected pixels
// follow from Pillow's conversions, worked out by hand in each test.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "image_writers.h"
#include "model/image/decode.h"

namespace dsv41 {
namespace {

using test::JpegSpec;
using test::PngSpec;
using test::write_jpeg;
using test::write_png;

RgbImage decode(const std::vector<uint8_t>& bytes, const DecodeLimits& limits = {}) {
  return decode_image(bytes.data(), bytes.size(), limits);
}

// Decoding must fail with ImageError whose message holds every one of `parts`.
void expect_refused(const std::vector<uint8_t>& bytes, std::initializer_list<std::string> parts,
                    const DecodeLimits& limits = {}) {
  try {
    RgbImage image = decode(bytes, limits);
    ADD_FAILURE() << "decoded a " << image.width << " x " << image.height << " image";
  } catch (const ImageError& e) {
    const std::string message = e.what();
    for (const std::string& p : parts) EXPECT_NE(message.find(p), std::string::npos) << message << "\nmissing: " << p;
  }
}

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

void expect_pixel(const RgbImage& image, int x, int y, int r, int g, int b) {
  const uint8_t* p = image.at(x, y);
  EXPECT_EQ(int(p[0]), r) << "R at " << x << "," << y;
  EXPECT_EQ(int(p[1]), g) << "G at " << x << "," << y;
  EXPECT_EQ(int(p[2]), b) << "B at " << x << "," << y;
}

// ---- PNG ----------------------------------------------------------------------------------------

TEST(ImageDecode, PngRgb8IsReadAsItIs) {
  const int w = 7, h = 5;
  std::mt19937 rng(1);
  std::vector<uint8_t> raw(size_t(w * h * 3));
  for (uint8_t& v : raw) v = uint8_t(rng());
  const RgbImage image = decode(write_png({w, h}, raw));
  EXPECT_EQ(image.width, w);
  EXPECT_EQ(image.height, h);
  EXPECT_EQ(image.pixels, raw);
}

TEST(ImageDecode, PngAdam7InterlacedGivesTheSamePixels) {
  const int w = 13, h = 11;  // not multiples of 8, so every Adam7 pass has partial blocks
  std::mt19937 rng(2);
  std::vector<uint8_t> raw(size_t(w * h * 3));
  for (uint8_t& v : raw) v = uint8_t(rng());
  PngSpec spec{w, h};
  spec.interlaced = true;
  EXPECT_EQ(decode(write_png(spec, raw)).pixels, raw);
}

// Pillow's RGBA -> RGB drops the alpha: a fully transparent pixel keeps its colour (no compositing
// on white or black).
TEST(ImageDecode, PngAlphaIsDroppedNotComposited) {
  PngSpec spec{2, 1, 8, PNG_COLOR_TYPE_RGB_ALPHA};
  const RgbImage image = decode(write_png(spec, {10, 20, 30, 0, 200, 100, 50, 128}));
  expect_pixel(image, 0, 0, 10, 20, 30);
  expect_pixel(image, 1, 0, 200, 100, 50);
  PngSpec la{2, 1, 8, PNG_COLOR_TYPE_GRAY_ALPHA};
  const RgbImage grey = decode(write_png(la, {77, 0, 250, 255}));
  expect_pixel(grey, 0, 0, 77, 77, 77);
  expect_pixel(grey, 1, 0, 250, 250, 250);
}

TEST(ImageDecode, PngGreyFillsTheThreeChannels) {
  PngSpec spec{3, 1, 8, PNG_COLOR_TYPE_GRAY};
  const RgbImage image = decode(write_png(spec, {0, 128, 255}));
  expect_pixel(image, 0, 0, 0, 0, 0);
  expect_pixel(image, 1, 0, 128, 128, 128);
  expect_pixel(image, 2, 0, 255, 255, 255);
}

// 1-, 2- and 4-bit grey are scaled to 0..255 by bit replication: Pillow's "1" gives 0/255, "L;2"
// multiplies by 85 (0b01010101), "L;4" by 17 (0x11).
TEST(ImageDecode, PngLowBitGreyIsScaledByBitReplication) {
  PngSpec one{8, 1, 1, PNG_COLOR_TYPE_GRAY};
  const RgbImage a = decode(write_png(one, {0b10110001}));
  const int bits[8] = {1, 0, 1, 1, 0, 0, 0, 1};
  for (int x = 0; x < 8; ++x) expect_pixel(a, x, 0, 255 * bits[x], 255 * bits[x], 255 * bits[x]);
  PngSpec two{4, 1, 2, PNG_COLOR_TYPE_GRAY};
  const RgbImage b = decode(write_png(two, {0b00011011}));  // levels 0, 1, 2, 3
  for (int x = 0; x < 4; ++x) expect_pixel(b, x, 0, 85 * x, 85 * x, 85 * x);
  PngSpec four{2, 1, 4, PNG_COLOR_TYPE_GRAY};
  const RgbImage c = decode(write_png(four, {0x3C}));  // levels 3, 12
  expect_pixel(c, 0, 0, 51, 51, 51);
  expect_pixel(c, 1, 0, 204, 204, 204);
}

// A palette image gives its palette colours; the transparency of an entry changes nothing
// (Pillow's P -> RGB looks the colour up and ignores tRNS). 2-bit indices, packed.
TEST(ImageDecode, PngPaletteGivesThePaletteColoursIgnoringTransparency) {
  PngSpec spec{4, 1, 2, PNG_COLOR_TYPE_PALETTE};
  spec.palette = {{255, 0, 0}, {0, 255, 0}, {0, 0, 255}, {9, 8, 7}};
  spec.trans_alpha = {255, 0};  // entry 1 fully transparent
  const RgbImage image = decode(write_png(spec, {0b11100100}));  // indices 3, 2, 1, 0
  expect_pixel(image, 0, 0, 9, 8, 7);
  expect_pixel(image, 1, 0, 0, 0, 255);
  expect_pixel(image, 2, 0, 0, 255, 0);
  expect_pixel(image, 3, 0, 255, 0, 0);
}

// 16-bit colour samples keep their high byte, truncated (Pillow unpacks "RGB;16B" so): 0x12FF
// gives 0x12, not the rounded 0x13.
TEST(ImageDecode, Png16BitColourKeepsTheHighByte) {
  PngSpec spec{1, 1, 16, PNG_COLOR_TYPE_RGB};
  expect_pixel(decode(write_png(spec, {0x12, 0xFF, 0xAB, 0xCD, 0x00, 0x80})), 0, 0, 0x12, 0xAB, 0x00);
  PngSpec rgba{1, 1, 16, PNG_COLOR_TYPE_RGB_ALPHA};
  expect_pixel(decode(write_png(rgba, {0xFE, 0x01, 0x7F, 0xFF, 0x01, 0x00, 0x00, 0x00})), 0, 0, 0xFE, 0x7F, 0x01);
}

// 16-bit grey opens in Pillow as I;16, whose conversion to RGB clips at 255 instead of scaling:
// 0x0080 -> 128, 0x00FF -> 255, 0x0100 -> 255.
TEST(ImageDecode, Png16BitGreyIsClippedAsPillowDoes) {
  PngSpec spec{5, 1, 16, PNG_COLOR_TYPE_GRAY};
  const RgbImage image = decode(write_png(spec, {0x00, 0x00, 0x00, 0x80, 0x00, 0xFF, 0x01, 0x00, 0xFF, 0xFF}));
  const int want[5] = {0, 128, 255, 255, 255};
  for (int x = 0; x < 5; ++x) expect_pixel(image, x, 0, want[x], want[x], want[x]);
}

TEST(ImageDecode, TruncatedOrCorruptPngIsRefused) {
  const int w = 32, h = 32;
  std::mt19937 rng(3);
  std::vector<uint8_t> raw(size_t(w * h * 3));
  for (uint8_t& v : raw) v = uint8_t(rng());  // random: the compressed data is about as long as the pixels
  const std::vector<uint8_t> png = write_png({w, h}, raw);
  expect_refused({png.begin(), png.begin() + ptrdiff_t(png.size() / 2)}, {"expected a valid PNG", "truncated"});
  std::vector<uint8_t> flipped = png;
  flipped[png.size() / 2] ^= 0x40;  // inside the image data: its CRC no longer matches
  expect_refused(flipped, {"expected a valid PNG", "libpng"});
  expect_refused({png.begin(), png.begin() + 20}, {"expected a valid PNG"});  // cut inside IHDR
}

// The size is checked from the header, before any pixel is decoded: this PNG has no image data at
// all, and a 20000 x 20000 one would need 1.2 GB.
TEST(ImageDecode, OversizedPngIsRefusedFromItsHeader) {
  PngSpec spec{20000, 20000};
  expect_refused(write_png(spec, {}, /*header_only=*/true),
                 {"expected at most 89478485 pixels", "PNG of 20000 x 20000 = 400000000 pixels"});
  // The limit is the caller's: a 100 x 100 image passes at 10000 pixels and not at 9999.
  const std::vector<uint8_t> small = write_png({100, 100}, std::vector<uint8_t>(100 * 100 * 3, 7));
  EXPECT_EQ(decode(small, {10000}).width, 100);
  expect_refused(small, {"at most 9999 pixels", "100 x 100 = 10000 pixels"}, {9999});
}

// Sides near 2^32 (found by fuzz/image_fuzz): their product is taken where it cannot overflow.
TEST(ImageDecode, HugePngSidesAreRefusedWithoutOverflow) {
  std::vector<uint8_t> png = bytes_of(std::string("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\xC3\xC4\xC5\xC6\xC7\xC8\xC9\xCA", 24));
  expect_refused(png, {"expected at most 89478485 pixels", "PNG of 3284452806 x 3351824842 = 11008910507527406652 pixels"});
}

// ---- JPEG ---------------------------------------------------------------------------------------

// A flat colour survives JPEG at quality 100 to within 2 levels: only the blocks' DC terms are
// nonzero, quantised with step 1, and the YCbCr conversion rounds once on each side (each under a
// level); chroma subsampling changes nothing on a flat image.
TEST(ImageDecode, JpegColourIsDecodedToRgb) {
  const int w = 24, h = 16;
  std::vector<uint8_t> pixels;
  for (int i = 0; i < w * h; ++i) pixels.insert(pixels.end(), {200, 100, 50});
  const RgbImage image = decode(write_jpeg({w, h}, pixels));
  ASSERT_EQ(image.width, w);
  ASSERT_EQ(image.height, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const uint8_t* p = image.at(x, y);
      EXPECT_NEAR(p[0], 200, 2);
      EXPECT_NEAR(p[1], 100, 2);
      EXPECT_NEAR(p[2], 50, 2);
    }
}

// Grey JPEG: one channel, replicated (Pillow's L -> RGB); exact channels, the level within one.
TEST(ImageDecode, JpegGreyFillsTheThreeChannels) {
  const int w = 8, h = 8;
  const RgbImage image = decode(write_jpeg({w, h, 1, JCS_GRAYSCALE}, std::vector<uint8_t>(size_t(w * h), 90)));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const uint8_t* p = image.at(x, y);
      EXPECT_EQ(p[0], p[1]);
      EXPECT_EQ(p[0], p[2]);
      EXPECT_NEAR(p[0], 90, 1);
    }
}

// libjpeg only warns at a premature end and fills the rest with grey; Pillow refuses a truncated
// file, and so does dsv41.
TEST(ImageDecode, TruncatedJpegIsRefused) {
  const int w = 64, h = 64;
  std::mt19937 rng(4);
  std::vector<uint8_t> pixels(size_t(w * h * 3));
  for (uint8_t& v : pixels) v = uint8_t(rng());
  const std::vector<uint8_t> jpeg = write_jpeg({w, h}, pixels);
  expect_refused({jpeg.begin(), jpeg.begin() + ptrdiff_t(jpeg.size() / 2)},
                 {"expected a valid JPEG", "Premature end of JPEG file"});
  expect_refused({jpeg.begin(), jpeg.begin() + 3}, {"expected a valid JPEG"});
}

// The frame header's size, raised to 20000 x 20000 in a valid file, is refused before decoding.
TEST(ImageDecode, OversizedJpegIsRefusedFromItsHeader) {
  std::vector<uint8_t> jpeg = write_jpeg({8, 8}, std::vector<uint8_t>(8 * 8 * 3, 128));
  bool patched = false;
  for (size_t i = 2; i + 9 < jpeg.size() && !patched; ++i)
    if (jpeg[i] == 0xFF && jpeg[i + 1] == 0xC0) {  // SOF0: length (2), precision (1), height (2), width (2)
      jpeg[i + 5] = jpeg[i + 7] = 20000 >> 8;
      jpeg[i + 6] = jpeg[i + 8] = 20000 & 0xFF;
      patched = true;
    }
  ASSERT_TRUE(patched);
  expect_refused(jpeg, {"expected at most 89478485 pixels", "JPEG of 20000 x 20000 = 400000000 pixels"});
}

TEST(ImageDecode, CmykJpegIsRefusedByName) {
  const std::vector<uint8_t> jpeg = write_jpeg({8, 8, 4, JCS_CMYK}, std::vector<uint8_t>(8 * 8 * 4, 60));
  expect_refused(jpeg, {"expected a grey, YCbCr or RGB JPEG", "found a CMYK one (not supported)"});
}

// ---- other data -----------------------------------------------------------------------------------

TEST(ImageDecode, OtherFormatsAreRefusedByName) {
  expect_refused({}, {"image: expected PNG or JPEG data", "found no data (0 bytes)"});
  expect_refused(bytes_of("GIF89a\x01\x00\x01\x00"), {"expected PNG or JPEG data", "found GIF (not supported)"});
  expect_refused(bytes_of(std::string("RIFF\x10\0\0\0WEBPVP8 ", 16)), {"found WebP (not supported)"});
  expect_refused(bytes_of("BM\x36\x00"), {"found BMP (not supported)"});
  expect_refused(bytes_of(std::string("II*\0\x08\0\0\0", 8)), {"found TIFF (not supported)"});
  expect_refused(bytes_of(std::string("\0\0\0\x1c" "ftypavif", 12)), {"found AVIF (not supported)"});
  expect_refused(bytes_of("<svg xmlns=\"http://www.w3.org/2000/svg\"/>"), {"found SVG (not supported)"});
  expect_refused(bytes_of("\xEF\xBB\xBF  \n<?xml version=\"1.0\"?><svg/>"), {"found SVG (not supported)"});
  expect_refused(bytes_of("hello, world"), {"found data of no known image format (12 bytes)"});
}

}  // namespace
}  // namespace dsv41
