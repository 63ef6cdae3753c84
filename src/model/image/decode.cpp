#include "model/image/decode.h"

// jpeglib.h needs size_t and FILE declared first.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

namespace dsv41 {
namespace {

constexpr const char* kWhere = "image";
constexpr const char* kSupported = "PNG or JPEG data";

bool starts_with(const uint8_t* data, size_t size, std::string_view prefix) {
  return size >= prefix.size() && std::memcmp(data, prefix.data(), prefix.size()) == 0;
}

[[noreturn]] void refuse(const std::string& expected, const std::string& found) {
  throw ImageError(std::string(kWhere) + ": expected " + expected + ", found " + found);
}

// Whether a width x height header (each side below 2^32, as both formats store it) is within the
// limits; the product is taken in 64 unsigned bits, where it cannot overflow.
bool within_limits(uint64_t width, uint64_t height, const DecodeLimits& limits) {
  return width > 0 && height > 0 && width * height <= uint64_t(std::max<int64_t>(limits.max_pixels, 0));
}

void check_pixels(uint64_t width, uint64_t height, const DecodeLimits& limits, const char* format) {
  if (width == 0 || height == 0)
    refuse("an image of at least 1 x 1 pixels",
           std::string("a ") + format + " of " + std::to_string(width) + " x " + std::to_string(height));
  if (!within_limits(width, height, limits))
    refuse("at most " + std::to_string(limits.max_pixels) + " pixels",
           std::string("a ") + format + " of " + std::to_string(width) + " x " + std::to_string(height) + " = " +
               std::to_string(width * height) + " pixels");
}

// ---- PNG -------------------------------------------------------------------------------------
//
// libpng reports errors by longjmp. The jump lands in png_run(), whose locals are all trivially
// destructible (C++ allows no jump over a destructor); what must be freed lives in decode_png()'s
// frame, which the jump never crosses. png_run() leaves an error message in the job instead of
// throwing, and decode_png() throws once libpng is cleaned up.

struct PngJob {
  const uint8_t* data;
  size_t size;
  size_t pos;
  const DecodeLimits* limits;
  png_structp png;
  png_infop info;
  std::vector<uint8_t>* raw;          // the rows as libpng delivers them after the transforms below
  std::vector<png_bytep>* row_ptrs;
  png_uint_32 width, height;
  int channels;                       // after the transforms: 1 (grey), 2 (grey, alpha), 3 (RGB), 4 (RGBA)
  bool grey16;                        // 16-bit grey, kept 16-bit (Pillow clips it, see below)
  char message[256];                  // set when libpng failed
  bool too_large;                     // the header is over the limits (checked in decode_png)
};

void png_read_bytes(png_structp png, png_bytep out, size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (n > job->size - job->pos) png_error(png, "the data ends before the image does (truncated file)");
  std::memcpy(out, job->data + job->pos, n);
  job->pos += n;
}

void png_on_error(png_structp png, png_const_charp message) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof job->message, "%s", message);
  png_longjmp(png, 1);
}

void png_on_warning(png_structp, png_const_charp) {}  // Pillow reads on past what libpng warns of

// 0: rows read; 1: libpng failed (job->message); 2: the header is over the limits.
int png_run(PngJob* job) {
  if (setjmp(png_jmpbuf(job->png))) return 1;
  png_set_read_fn(job->png, job, png_read_bytes);
  png_read_info(job->png, job->info);
  int bit_depth = 0, color_type = 0;
  png_get_IHDR(job->png, job->info, &job->width, &job->height, &bit_depth, &color_type, nullptr, nullptr, nullptr);
  if (!within_limits(job->width, job->height, *job->limits)) return 2;
  // Pillow's conversions (docs/vision.md §1): palettes to their colours; 1/2/4-bit grey scaled to
  // 0..255 by bit replication; 16-bit samples cut to their high byte ("RGB;16B" and kin), except
  // 16-bit grey, which Pillow opens as I;16 and clips to 255 when converting.
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(job->png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(job->png);
  job->grey16 = bit_depth == 16 && color_type == PNG_COLOR_TYPE_GRAY;
  if (bit_depth == 16 && !job->grey16) png_set_strip_16(job->png);
  png_set_interlace_handling(job->png);
  png_read_update_info(job->png, job->info);
  job->channels = png_get_channels(job->png, job->info);
  const size_t row_bytes = png_get_rowbytes(job->png, job->info);
  job->raw->resize(row_bytes * job->height);
  job->row_ptrs->resize(job->height);
  for (png_uint_32 y = 0; y < job->height; ++y) (*job->row_ptrs)[y] = job->raw->data() + row_bytes * y;
  png_read_image(job->png, job->row_ptrs->data());
  return 0;
}

uint32_t big_endian32(const uint8_t* p) { return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | p[3]; }

RgbImage decode_png(const uint8_t* data, size_t size, const DecodeLimits& limits) {
  // IHDR is the first chunk (8-byte signature, then length, "IHDR", width, height): its size is
  // checked before libpng reads on, so that a huge header is refused even when nothing follows it.
  if (size >= 24 && std::memcmp(data + 12, "IHDR", 4) == 0)
    check_pixels(big_endian32(data + 16), big_endian32(data + 20), limits, "PNG");
  std::vector<uint8_t> raw;
  std::vector<png_bytep> row_ptrs;
  PngJob job{};
  job.data = data;
  job.size = size;
  job.limits = &limits;
  job.raw = &raw;
  job.row_ptrs = &row_ptrs;
  job.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, png_on_error, png_on_warning);
  if (!job.png) throw ImageError("image: libpng could not start (out of memory)");
  job.info = png_create_info_struct(job.png);
  int status = job.info ? png_run(&job) : 1;
  if (!job.info) std::snprintf(job.message, sizeof job.message, "out of memory");
  png_destroy_read_struct(&job.png, job.info ? &job.info : nullptr, nullptr);
  if (status == 1) refuse("a valid PNG", std::string("a corrupt one (libpng: ") + job.message + ")");
  if (status == 2) check_pixels(job.width, job.height, limits, "PNG");

  RgbImage image;
  image.width = int(job.width);
  image.height = int(job.height);
  image.pixels.resize(size_t(job.width) * job.height * 3);
  const size_t n = size_t(job.width) * job.height;
  const uint8_t* in = raw.data();
  uint8_t* out = image.pixels.data();
  for (size_t i = 0; i < n; ++i, out += 3) {
    switch (job.channels) {
      case 1: {
        // 16-bit grey arrives big-endian; Pillow's I;16 -> RGB gives min(v, 255).
        const uint8_t v = job.grey16 ? (in[0] != 0 ? 255 : in[1]) : in[0];
        out[0] = out[1] = out[2] = v;
        in += job.grey16 ? 2 : 1;
        break;
      }
      case 2:  // grey and alpha: the alpha is dropped, as Pillow's LA -> RGB drops it
        out[0] = out[1] = out[2] = in[0];
        in += 2;
        break;
      default:  // RGB, or RGBA whose alpha is dropped (not composited), as Pillow's RGBA -> RGB
        out[0] = in[0];
        out[1] = in[1];
        out[2] = in[2];
        in += job.channels;
        break;
    }
  }
  return image;
}

// ---- JPEG ------------------------------------------------------------------------------------
//
// The same arrangement as the PNG decoder's: libjpeg's error_exit longjmps into jpeg_run().

struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Pillow refuses a truncated file (ImageFile.LOAD_TRUNCATED_IMAGES is off), where libjpeg only
// warns and fills the rest with grey: that warning is an error here. libjpeg's other warnings
// (corrupt data it recovers from) pass, as they do in Pillow.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_on_error(cinfo);
}

struct JpegJob {
  const uint8_t* data;
  size_t size;
  jpeg_decompress_struct* cinfo;
  JpegError* err;
  const DecodeLimits* limits;
  std::vector<uint8_t>* raw;
  JDIMENSION width, height;
  int channels;
  J_COLOR_SPACE color_space;
};

// 0: decoded; 1: libjpeg failed (err->message); 2: over the limits; 3: unsupported colour space.
int jpeg_run(JpegJob* job) {
  if (setjmp(job->err->jump)) return 1;
  jpeg_decompress_struct* cinfo = job->cinfo;
  jpeg_create_decompress(cinfo);
  jpeg_mem_src(cinfo, job->data, static_cast<unsigned long>(job->size));
  jpeg_read_header(cinfo, TRUE);
  job->width = cinfo->image_width;
  job->height = cinfo->image_height;
  job->color_space = cinfo->jpeg_color_space;
  if (!within_limits(job->width, job->height, *job->limits)) return 2;
  // Grey stays grey (replicated below); YCbCr and RGB come out RGB through libjpeg's own colour
  // conversion, as in Pillow. The IDCT and upsampling are libjpeg's defaults, which Pillow keeps.
  switch (cinfo->jpeg_color_space) {
    case JCS_GRAYSCALE: cinfo->out_color_space = JCS_GRAYSCALE; break;
    case JCS_YCbCr:
    case JCS_RGB: cinfo->out_color_space = JCS_RGB; break;
    default: return 3;
  }
  jpeg_start_decompress(cinfo);
  job->channels = cinfo->output_components;
  const size_t row_bytes = size_t(cinfo->output_width) * job->channels;
  job->raw->resize(row_bytes * cinfo->output_height);
  while (cinfo->output_scanline < cinfo->output_height) {
    JSAMPROW row = job->raw->data() + row_bytes * cinfo->output_scanline;
    jpeg_read_scanlines(cinfo, &row, 1);
  }
  return 0;
}

RgbImage decode_jpeg(const uint8_t* data, size_t size, const DecodeLimits& limits) {
  std::vector<uint8_t> raw;
  jpeg_decompress_struct cinfo{};
  JpegError err{};
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_on_error;
  err.mgr.emit_message = jpeg_on_message;
  JpegJob job{data, size, &cinfo, &err, &limits, &raw, 0, 0, 0, JCS_UNKNOWN};
  const int status = jpeg_run(&job);
  jpeg_destroy_decompress(&cinfo);  // also after a failed jpeg_create_decompress (cinfo.mem is then null)
  if (status == 1) refuse("a valid JPEG", std::string("a corrupt one (libjpeg: ") + err.message + ")");
  if (status == 2) check_pixels(job.width, job.height, limits, "JPEG");
  if (status == 3)
    refuse("a grey, YCbCr or RGB JPEG",
           std::string("a ") + (job.color_space == JCS_CMYK ? "CMYK" : job.color_space == JCS_YCCK ? "YCCK" : "other") +
               " one (not supported)");

  RgbImage image;
  image.width = int(job.width);
  image.height = int(job.height);
  if (job.channels == 3) {
    image.pixels = std::move(raw);
  } else {
    image.pixels.resize(raw.size() * 3);
    for (size_t i = 0; i < raw.size(); ++i) image.pixels[3 * i] = image.pixels[3 * i + 1] = image.pixels[3 * i + 2] = raw[i];
  }
  return image;
}

}  // namespace

std::string image_format(const uint8_t* data, size_t size) {
  if (starts_with(data, size, "\x89PNG\r\n\x1a\n")) return "PNG";
  if (starts_with(data, size, "\xFF\xD8\xFF")) return "JPEG";
  if (starts_with(data, size, "GIF87a") || starts_with(data, size, "GIF89a")) return "GIF";
  if (size >= 12 && starts_with(data, size, "RIFF") && std::memcmp(data + 8, "WEBP", 4) == 0) return "WebP";
  if (starts_with(data, size, "BM")) return "BMP";
  if (starts_with(data, size, std::string_view("II*\0", 4)) || starts_with(data, size, std::string_view("MM\0*", 4)))
    return "TIFF";
  if (size >= 12 && std::memcmp(data + 4, "ftyp", 4) == 0) {
    const std::string_view brand(reinterpret_cast<const char*>(data) + 8, 4);
    if (brand == "avif" || brand == "avis") return "AVIF";
    if (brand == "heic" || brand == "heix" || brand == "mif1" || brand == "msf1") return "HEIF";
  }
  // Text: SVG (or other XML), after an optional UTF-8 byte-order mark and white space.
  size_t i = starts_with(data, size, "\xEF\xBB\xBF") ? 3 : 0;
  while (i < size && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n')) ++i;
  if (starts_with(data + i, size - i, "<svg") || starts_with(data + i, size - i, "<?xml") ||
      starts_with(data + i, size - i, "<!DOCTYPE svg"))
    return "SVG";
  return "";
}

RgbImage decode_image(const uint8_t* data, size_t size, const DecodeLimits& limits) {
  if (size == 0) refuse(kSupported, "no data (0 bytes)");
  const std::string format = image_format(data, size);
  if (format == "PNG") return decode_png(data, size, limits);
  if (format == "JPEG") return decode_jpeg(data, size, limits);
  if (!format.empty()) refuse(kSupported, format + " (not supported)");
  refuse(kSupported, "data of no known image format (" + std::to_string(size) + " bytes)");
}

}  // namespace dsv41
