#include "forward/vision_cpu.h"

#include <string>

#include "backend/cpu/norm.h"
#include "backend/cpu/pixel_unshuffle.h"
#include "backend/cpu/vision.h"
#include "backend/cpu/vision_rope.h"
#include "base/error.h"
#include "forward/vision_network.h"
#include "numerics/types.h"

namespace dsv41 {
namespace {

constexpr float kVisionNormEps = 1e-6f;  // vision.py RMSNorm's default

struct VisionTensor {
  int64_t rows = 0, cols = 0;
  std::vector<float> data;
  VisionTensor() = default;
  VisionTensor(int64_t r, int64_t c) : rows(r), cols(c), data(size_t(r * c)) {}
};

// The aligner's token count for an image: its patch grid cut in r x r cells, the last ones partial.
int64_t aligner_tokens(const VisionImage& im, int r) { return int64_t((im.n_vit_h + r - 1) / r) * ((im.n_vit_w + r - 1) / r); }

// The CPU op set of vision_network.h over one call's images.
class CpuVisionOps {
 public:
  using Tensor = VisionTensor;

  CpuVisionOps(const Config& c, const std::vector<VisionImage>& images)
      : c_(c), images_(images), rope_(c.vision.dim / c.vision.n_heads, c.vision.rope_theta) {
    for (const VisionImage& im : images) rows_ += int64_t(im.n_vit_h) * im.n_vit_w;
  }

  Tensor patches() const {
    const int64_t per_patch = 3LL * c_.vision.patch_size * c_.vision.patch_size;
    Tensor t(rows_, per_patch);
    int64_t at = 0;
    for (const VisionImage& im : images_)
      for (int64_t i = 0; i < int64_t(im.n_vit_h) * im.n_vit_w * per_patch; ++i) t.data[size_t(at++)] = bf16_to_float(im.patches[i]);
    return t;
  }

  Tensor linear(const Tensor& x, const Weight& w, const Weight* bias) const {
    Tensor y(x.rows, w.rows);
    linear_bias(x.data.data(), x.rows, w, bias, y.data.data());
    return y;
  }

  Tensor norm(const Tensor& x, const Weight& w) const {
    Tensor y(x.rows, x.cols);
    rms_norm(x.data.data(), x.rows, x.cols, &w, kVisionNormEps, y.data.data());
    return y;
  }

  void rope(Tensor& qkv) const {
    const int heads = c_.vision.n_heads;
    const int64_t width = c_.vision.dim;
    int64_t row = 0;
    for (const VisionImage& im : images_)
      for (int y = 0; y < im.n_vit_h; ++y)
        for (int x = 0; x < im.n_vit_w; ++x, ++row) {
          float* r = qkv.data.data() + row * qkv.cols;
          rope_.apply(r, heads, y, x);          // q
          rope_.apply(r + width, heads, y, x);  // k
        }
  }

  Tensor attention(const Tensor& qkv) const {
    Tensor o(qkv.rows, c_.vision.dim);
    int64_t row = 0;
    for (const VisionImage& im : images_) {
      const int64_t n = int64_t(im.n_vit_h) * im.n_vit_w;
      vision_attention(qkv.data.data() + row * qkv.cols, n, c_.vision.n_heads, c_.vision.dim / c_.vision.n_heads,
                       o.data.data() + row * o.cols);
      row += n;
    }
    return o;
  }

  void add(Tensor& x, const Tensor& y) const { add_bf16(x.data.data(), y.data.data(), int64_t(x.data.size())); }

  Tensor silu_mul(const Tensor& gate_up) const {
    Tensor y(gate_up.rows, gate_up.cols / 2);
    dsv41::silu_mul(gate_up.data.data(), gate_up.rows, y.cols, y.data.data());
    return y;
  }

  Tensor unshuffle(const Tensor& x) const {
    const int r = c_.vision.downsample_ratio;
    int64_t tokens = 0;
    for (const VisionImage& im : images_) tokens += aligner_tokens(im, r);
    Tensor t(tokens, x.cols * r * r);
    int64_t row = 0, token = 0;
    for (const VisionImage& im : images_) {
      pixel_unshuffle(x.data.data() + row * x.cols, im.n_vit_h, im.n_vit_w, x.cols, r, t.data.data() + token * t.cols);
      row += int64_t(im.n_vit_h) * im.n_vit_w;
      token += aligner_tokens(im, r);
    }
    return t;
  }

  void gelu(Tensor& x) const { dsv41::gelu(x.data.data(), int64_t(x.data.size())); }

 private:
  const Config& c_;
  const std::vector<VisionImage>& images_;
  VisionRope rope_;
  int64_t rows_ = 0;
};

}  // namespace

std::vector<std::vector<float>> encode_images(const Config& c, const VisionWeights& w,
                                              const std::vector<VisionImage>& images) {
  if (!c.has_vision()) fail("encode_images", "a config with a vision tower", "vision_n_layers 0");
  for (const VisionImage& im : images)
    if (!im.patches || im.n_vit_h < 1 || im.n_vit_w < 1)
      fail("encode_images", "images of at least one patch", std::to_string(im.n_vit_h) + " x " + std::to_string(im.n_vit_w));
  std::vector<std::vector<float>> out;
  if (images.empty()) return out;
  CpuVisionOps ops(c, images);
  const VisionTensor rows = run_vision(c.vision, w, ops);
  const int r = c.vision.downsample_ratio;
  int64_t token = 0;
  for (const VisionImage& im : images) {
    const int64_t n = aligner_tokens(im, r);
    out.emplace_back(rows.data.begin() + token * rows.cols, rows.data.begin() + (token + n) * rows.cols);
    token += n;
  }
  return out;
}

}  // namespace dsv41
