#pragma once
// Test images written with libpng and libjpeg from pixels a test chooses (image_decode_test,
// image_pillow_oracle_test). A failure of either library here is a mistake in the test: it aborts.
#include <algorithm>
#include <csetjmp>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include <jpeglib.h>
#include <png.h>

namespace dsv41::test {

struct PngSpec {
  PngSpec(int w, int h, int depth = 8, int type = PNG_COLOR_TYPE_RGB)
      : width(w), height(h), bit_depth(depth), color_type(type) {}
  int width, height;
  int bit_depth;
  int color_type;
  bool interlaced = false;
  std::vector<png_color> palette;
  std::vector<uint8_t> trans_alpha;  // palette transparency (tRNS)
};

inline void append_bytes(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<std::vector<uint8_t>*>(png_get_io_ptr(png));
  out->insert(out->end(), data, data + n);
}

// Rows as the PNG stores them (packed below 8 bits, big-endian at 16). With `header_only`, only the
// signature and the chunks before the image data are written.
inline void write_png_into(const PngSpec& s, std::vector<png_bytep>& rows, std::vector<uint8_t>& out, bool header_only) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) std::abort();
  png_set_write_fn(png, &out, append_bytes, nullptr);
  png_set_IHDR(png, info, png_uint_32(s.width), png_uint_32(s.height), s.bit_depth, s.color_type,
               s.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!s.palette.empty()) png_set_PLTE(png, info, s.palette.data(), int(s.palette.size()));
  if (!s.trans_alpha.empty()) png_set_tRNS(png, info, s.trans_alpha.data(), int(s.trans_alpha.size()), nullptr);
  png_write_info(png, info);
  if (!header_only) {
    png_write_image(png, rows.data());
    png_write_end(png, nullptr);
  }
  png_destroy_write_struct(&png, &info);
}

inline std::vector<uint8_t> write_png(const PngSpec& s, std::vector<uint8_t> raw, bool header_only = false) {
  std::vector<png_bytep> rows(size_t(s.height));
  const size_t row_bytes = raw.size() / size_t(std::max(s.height, 1));
  for (int y = 0; y < s.height && !raw.empty(); ++y) rows[size_t(y)] = raw.data() + row_bytes * size_t(y);
  std::vector<uint8_t> out;
  write_png_into(s, rows, out, header_only);
  return out;
}

struct JpegSpec {
  JpegSpec(int w, int h, int n = 3, J_COLOR_SPACE space = JCS_RGB)
      : width(w), height(h), components(n), color_space(space) {}
  int width, height;
  int components;
  J_COLOR_SPACE color_space;
  int quality = 100;
  bool progressive = false;
};

inline std::vector<uint8_t> write_jpeg(const JpegSpec& s, std::vector<uint8_t> pixels) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr err{};
  cinfo.err = jpeg_std_error(&err);  // the default error_exit ends the process: a test mistake
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = JDIMENSION(s.width);
  cinfo.image_height = JDIMENSION(s.height);
  cinfo.input_components = s.components;
  cinfo.in_color_space = s.color_space;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, s.quality, TRUE);
  if (s.progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = pixels.data() + size_t(cinfo.next_scanline) * size_t(s.width) * size_t(s.components);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return out;
}

}  // namespace dsv41::test
