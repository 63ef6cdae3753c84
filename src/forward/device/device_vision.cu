// The device's op set for the vision tower (vision_network.h says what each op is; forward/
// vision_cpu.cpp is the CPU's, the reference). A Tensor is a [rows, cols] device buffer of fp32
// holding bf16 values, from the stream-ordered scratch pool. What the CPU op set does image by image
// reads tables here: the RoPE the patches' places, the attention each image's row range (one launch
// per image), the unshuffle its gather sources (forward/vision_layout.h).
#include "forward/device/device_vision.h"

#include <string>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/vision.h"
#include "base/error.h"
#include "forward/vision_layout.h"
#include "forward/vision_network.h"

namespace dsv41::cuda {

namespace {

constexpr float kVisionNormEps = 1e-6f;  // vision.py RMSNorm's default

struct VisionTensor {
  int64_t rows = 0, cols = 0;
  DeviceBuffer<float> data;
  float* get() const { return data.get(); }
};

class CudaVisionOps {
 public:
  using Tensor = VisionTensor;

  CudaVisionOps(const DeviceModel& m, const std::vector<VisionImage>& images, cudaStream_t stream)
      : m_(m), v_(m.config().vision), images_(images), stream_(stream), layout_(vision_layout(images, v_.downsample_ratio)),
        places_(scratch_from(layout_.places, stream)), sources_(scratch_from(layout_.unshuffle, stream)) {}

  const VisionLayout& layout() const { return layout_; }

  Tensor patches() {
    const int64_t per_patch = 3LL * v_.patch_size * v_.patch_size, cols = m_.vision().patch_embed.cols;
    return Tensor{layout_.patches, cols, scratch_from(stacked_patches(images_, per_patch, cols), stream_)};
  }

  Tensor linear(const Tensor& x, const Weight& w, const Weight* bias) {
    if (x.cols != w.cols)
      fail("cuda vision linear", std::to_string(w.cols) + " input columns", std::to_string(x.cols));
    Tensor y = make(x.rows, w.rows);
    linear_bias(x.get(), x.rows, w, bias, y.get(), stream_);
    return y;
  }

  Tensor norm(const Tensor& x, const Weight& w) {
    Tensor y = make(x.rows, x.cols);
    rms_norm(x.get(), x.rows, x.cols, &w, kVisionNormEps, y.get(), stream_);
    return y;
  }

  void rope(Tensor& qkv) {
    vision_rope(qkv.get(), qkv.rows, v_.n_heads, v_.dim / v_.n_heads, places_.get(), m_.vision_rope_freqs(), stream_);
  }

  Tensor attention(const Tensor& qkv) {
    Tensor o = make(qkv.rows, v_.dim);
    for (size_t i = 0; i < images_.size(); ++i) {
      const int64_t first = layout_.patch_first[i], n = layout_.patch_first[i + 1] - first;
      vision_attention(qkv.get() + first * qkv.cols, n, v_.n_heads, v_.dim / v_.n_heads, o.get() + first * o.cols, stream_);
    }
    return o;
  }

  void add(Tensor& x, const Tensor& y) { add_bf16(x.get(), y.get(), x.rows * x.cols, stream_); }

  Tensor silu_mul(const Tensor& gate_up) {
    Tensor y = make(gate_up.rows, gate_up.cols / 2);
    cuda::silu_mul(gate_up.get(), gate_up.rows, y.cols, y.get(), stream_);
    return y;
  }

  Tensor unshuffle(const Tensor& x) {
    const int r = v_.downsample_ratio;
    Tensor t = make(layout_.tokens, x.cols * r * r);
    pixel_unshuffle(x.get(), x.cols, sources_.get(), layout_.tokens, r, t.get(), stream_);
    return t;
  }

  void gelu(Tensor& x) { cuda::gelu(x.get(), x.rows * x.cols, stream_); }

 private:
  Tensor make(int64_t rows, int64_t cols) { return Tensor{rows, cols, scratch<float>(rows * cols, stream_)}; }

  const DeviceModel& m_;
  const VisionConfig& v_;
  const std::vector<VisionImage>& images_;
  cudaStream_t stream_;
  VisionLayout layout_;
  DeviceBuffer<int32_t> places_, sources_;
};

}  // namespace

std::vector<std::vector<float>> encode_images(const DeviceModel& model, const std::vector<VisionImage>& images,
                                              cudaStream_t stream) {
  const Config& c = model.config();
  if (!c.has_vision()) fail("cuda encode_images", "a config with a vision tower", "vision_n_layers 0");
  for (const VisionImage& im : images)
    if (!im.patches || im.n_vit_h < 1 || im.n_vit_w < 1)
      fail("cuda encode_images", "images of at least one patch", std::to_string(im.n_vit_h) + " x " + std::to_string(im.n_vit_w));
  std::vector<std::vector<float>> out;
  if (images.empty()) return out;
  CudaVisionOps ops(model, images, stream);
  const VisionTensor rows = run_vision(c.vision, model.vision(), ops);
  const std::vector<float> all = rows.data.download(stream);
  const VisionLayout& l = ops.layout();
  for (size_t i = 0; i < images.size(); ++i)
    out.emplace_back(all.begin() + l.token_first[i] * rows.cols, all.begin() + l.token_first[i + 1] * rows.cols);
  return out;
}

}  // namespace dsv41::cuda
