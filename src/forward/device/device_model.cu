// Placing a Model's tensors on the device (device_model.h).
//
// fill_kernel writes a benchmark's random tensor in place, one thread per byte: a hash of (seed,
// tensor, index) gives a uniform u in [-1, 1), stored in the tensor's own format and scaled so a
// product with a unit-RMS input stays unit-RMS (1/√cols): fp8 codes of u with a ue8m0 block scale
// of 2^-round(log2 √cols); fp4 codes of 6u with that scale / 8; bf16 and fp32 values directly.
// Norm weights are ones, biases and sinks zeros. The values are not trained, the arithmetic and
// the memory traffic are the real ones.
#include "forward/device/device_model.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backend/cpu/vision_rope.h"
#include "backend/cuda/check.h"
#include "backend/cuda/linear.h"
#include "base/error.h"
#include "forward/vision_layout.h"
#include "numerics/codecs.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

__device__ __forceinline__ uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// kind: 0 matrix, 1 ones, 2 zeros. scale_code: the ue8m0 byte of a scale tensor (0 = data).
__global__ void fill_kernel(uint8_t* out, int64_t bytes, uint64_t key, WeightFormat format, int kind, float amplitude,
                            int scale_code) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= bytes) return;
  if (scale_code > 0) {
    out[i] = uint8_t(scale_code);
    return;
  }
  const uint64_t h = mix(key ^ uint64_t(i) * 0xD1B54A32D192ED03ull);
  const float u = float(h >> 40) * 0x1p-23f - 1.0f;  // [-1, 1)
  const float value = kind == 1 ? 1.0f : kind == 2 ? 0.0f : u * amplitude;
  switch (format) {
    case WeightFormat::FP8: out[i] = e4m3_from_float(kind == 0 ? u : value); break;
    case WeightFormat::FP4:
      out[i] = uint8_t(e2m1_from_float(6.0f * u) | (e2m1_from_float(6.0f * float(h & 0xFFFF) * 0x1p-16f - 3.0f) << 4));
      break;
    case WeightFormat::BF16: {
      const uint16_t b = bf16_from_float(value);
      out[i] = uint8_t(i % 2 == 0 ? b & 0xFF : b >> 8);
      break;
    }
    case WeightFormat::F32: {
      // Four threads write the four bytes of one value: all derive it from the value's index.
      const int64_t v = i / 4;
      const uint64_t hv = mix(key ^ uint64_t(v) * 0xD1B54A32D192ED03ull);
      const float uv = float(hv >> 40) * 0x1p-23f - 1.0f;
      const float x = kind == 1 ? 1.0f : kind == 2 ? 0.0f : uv * amplitude;
      out[i] = uint8_t(float_bits(x) >> (8 * (i % 4)));
      break;
    }
  }
}

}  // namespace

const Weight& DeviceModel::placed_wo_a(const AttentionWeights& a, int64_t o_groups) {
  return cuda::widened_usable(a.wo_a_fp8, o_groups) ? a.wo_a_fp8 : a.wo_a;
}

DeviceModel::DeviceModel(const Model& model, Values values, uint64_t seed) : model_(model), values_(values), seed_(seed) {
  const Config& c = model.config();
  // The shapes the attention and indexer kernels are built for, refused here rather than mid-call.
  if (c.head_dim != 64 && c.head_dim != 512) fail("DeviceModel", "head_dim 64 or 512 (the attention kernel's)", std::to_string(c.head_dim));
  if (!c.index_source_layers.empty()) {
    if (c.index_head_dim != 32 && c.index_head_dim != 64 && c.index_head_dim != 128)
      fail("DeviceModel", "index_head_dim 32, 64 or 128 (the indexer's)", std::to_string(c.index_head_dim));
    if (c.index_n_heads < 1 || c.index_n_heads > 64) fail("DeviceModel", "1 to 64 index heads", std::to_string(c.index_n_heads));
  }
  embed_ = place(model.embed(), Fill::Matrix);
  norm_ = place(model.norm(), Fill::Ones);
  head_ = place(model.head(), Fill::Matrix);
  // The backbone's layers, then DSpark's stages (blocks of the same table, named mtp.<j>).
  const int blocks = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  layers_.resize(size_t(blocks));
  engram_qk_.assign(size_t(blocks), nullptr);
  sink_.assign(size_t(blocks), nullptr);
  for (int i = 0; i < blocks; ++i) {
    const LayerWeights& h = model.layer(i);
    LayerWeights& d = layers_[size_t(i)];
    d.id = h.id;
    const std::string prefix = i < c.n_layers ? "layers." + std::to_string(i) + "." : "mtp." + std::to_string(i - c.n_layers) + ".";
    std::vector<size_t> routed;  // buffers_ indices of the routed experts' row-major bytes
    for_each_block_tensor(
        c, prefix, i,
        [&](const BlockTensor& t, const auto& from, auto& to) {
          if constexpr (std::is_same_v<std::remove_cvref_t<decltype(from)>, Weight>) {
            const size_t before = buffers_.size();
            to = place(&from == &h.attn.wo_a ? placed_wo_a(h.attn, c.o_groups) : from, random_fill(t));
            if (t.expert >= 0 && to.quantized())
              for (size_t b = before; b < buffers_.size(); ++b) routed.push_back(b);
          } else {  // the Engram table and its scales: unit-variance rows (cols 1)
            to = place_bytes(from, tensor_bytes(t), Fill::Matrix, WeightFormat::FP8, 1, t.role == WeightRole::Scale);
          }
        },
        h, d);
    sink_[size_t(i)] = reinterpret_cast<const float*>(d.attn.attn_sink.data);
    std::vector<Weight> w1, w2, w3;
    for (const ExpertWeights& e : d.experts) w1.push_back(e.w1), w2.push_back(e.w2), w3.push_back(e.w3);
    experts_.push_back(std::make_unique<ExpertTable>(w1, w2, w3));
    // The table holds the quantized experts in its tile layout: their row-major bytes go, and the
    // layer's expert weights keep their shapes and formats but no bytes (bf16 experts stay: the
    // table reads them in place).
    for (ExpertWeights& e : d.experts)
      for (Weight* w : {&e.w1, &e.w2, &e.w3})
        if (w->quantized()) w->data = w->scale = nullptr;
    for (const size_t b : routed) {
      bytes_ -= buffers_[b].bytes();
      buffers_[b] = DeviceBuffer<uint8_t>();
    }
    bytes_ += experts_.back()->bytes();
    if (h.engram) engram_qk_[size_t(i)] = place_floats(h.engram->qk, Fill::Ones);
  }
  for (int j = 0; j < (c.has_dspark() ? c.n_mtp_layers : 0); ++j)
    for_each_dspark_tensor(
        c, j, [&](const BlockTensor& t, const Weight& from, Weight& to) { to = place(from, random_fill(t)); }, model.dspark(),
        dspark_);
  for (int i = 0; i < blocks; ++i) {
    const float*& freqs = c.compress_ratios[size_t(i)] > 0 ? freqs_compressed_ : freqs_window_;
    if (!freqs) freqs = place_floats(model.rope(i).frequencies(), Fill::Host);
  }
  if (c.has_vision()) place_vision();
  check(cudaDeviceSynchronize(), "DeviceModel");
}

// Every tensor of the tower in its checkpoint format, but patch_embed, whose rows get zero columns
// up to a multiple of 8 (the GEMM reads 16-byte rows; the patch rows are padded alike, so every
// product is unchanged).
void DeviceModel::place_vision() {
  const Config& c = config();
  vision_.blocks.resize(size_t(c.vision.n_layers));
  for_each_vision_tensor(
      c,
      [&](const VisionTensorSpec& t, const Weight& from, Weight& to) {
        to = t.name == "vision.patch_embed.proj.weight" ? place_padded(from, padded_columns(from.cols)) : place(from, vision_fill(t.name));
      },
      model_.vision(), vision_);
  const int head_dim = c.vision.dim / c.vision.n_heads;
  vision_freqs_ = place_floats(VisionRope(head_dim, c.vision.rope_theta).frequencies(), Fill::Host);
}

Weight DeviceModel::place_padded(const Weight& w, int64_t cols) {
  if (cols == w.cols) return place(w, Fill::Matrix);
  if (w.format != WeightFormat::BF16) fail("DeviceModel", "a BF16 matrix to pad", "another format");
  std::vector<uint16_t> padded;
  if (values_ == Values::Checkpoint) padded = pad_columns(reinterpret_cast<const uint16_t*>(w.data), w.rows, w.cols, cols);
  Weight d = w;
  d.cols = cols;
  d.data = place_bytes(reinterpret_cast<const uint8_t*>(padded.data()), d.data_bytes(), Fill::Matrix, w.format, cols, false);
  return d;
}

DeviceModel::Fill DeviceModel::vision_fill(const std::string& name) {
  if (name.ends_with("norm1.weight") || name.ends_with("norm2.weight") || name.ends_with("norm.weight")) return Fill::Ones;
  if (name.ends_with(".bias")) return Fill::Zeros;
  return Fill::Matrix;
}

const float* DeviceModel::rope_freqs(int i) const {
  return config().compress_ratios[size_t(i)] > 0 ? freqs_compressed_ : freqs_window_;
}

DeviceModel::Fill DeviceModel::random_fill(const BlockTensor& t) {
  const std::string& n = t.name;
  if (n.ends_with("norm.weight") || n.ends_with("_scale")) return Fill::Ones;
  if (n.ends_with("_base") || n.ends_with("attn_sink") || n.ends_with("gate.bias") || n.ends_with("gate.bias_vl"))
    return Fill::Zeros;
  return Fill::Matrix;
}

int64_t DeviceModel::tensor_bytes(const BlockTensor& t) {
  int64_t n = int64_t(dtype_size(t.dtype));
  for (const int64_t d : t.shape) n *= d;
  return n;
}

Weight DeviceModel::place(const Weight& w, Fill fill) {
  if (!w.data) return w;  // a weight this layer does not have
  Weight d = w;
  d.data = place_bytes(w.data, w.data_bytes(), fill, w.format, w.cols, false);
  if (w.quantized()) d.scale = place_bytes(w.scale, w.scale_bytes(), fill, w.format, w.cols, true);
  return d;
}

const uint8_t* DeviceModel::place_bytes(const uint8_t* host, int64_t bytes, Fill fill, WeightFormat format, int64_t cols,
                                        bool scale) {
  DeviceBuffer<uint8_t>& b = buffers_.emplace_back(bytes);
  bytes_ += bytes;
  ++tensors_;
  if (values_ == Values::Checkpoint) {
    b.upload(host, bytes);
    return b.get();
  }
  // 1/√cols as a power of two (the ue8m0 scale); fp4 codes reach 6, so an eighth of it.
  const int shift = int(std::lround(std::log2(std::sqrt(double(cols)))));
  int scale_code = 0;
  if (scale) scale_code = 127 - shift - (format == WeightFormat::FP4 ? 3 : 0);
  const int kind = fill == Fill::Matrix ? 0 : fill == Fill::Ones ? 1 : 2;
  constexpr int kThreads = 256;
  fill_kernel<<<unsigned((bytes + kThreads - 1) / kThreads), kThreads>>>(
      b.get(), bytes, seed_ * 0x100000001B3ull + tensors_, format, kind, float(1.0 / std::sqrt(double(cols))), scale_code);
  check_launch("DeviceModel random fill");
  return b.get();
}

const float* DeviceModel::place_floats(const std::vector<float>& host, Fill fill) {
  if (fill == Fill::Host || values_ == Values::Checkpoint) {
    DeviceBuffer<uint8_t>& b = buffers_.emplace_back(int64_t(host.size() * 4));
    b.upload(reinterpret_cast<const uint8_t*>(host.data()), int64_t(host.size() * 4));
    bytes_ += b.bytes();
    return reinterpret_cast<const float*>(b.get());
  }
  return reinterpret_cast<const float*>(place_bytes(nullptr, int64_t(host.size() * 4), fill, WeightFormat::F32, 1, false));
}

}  // namespace dsv41::cuda
