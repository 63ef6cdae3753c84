#pragma once
// A loaded model's weights in device memory, bound as the host Model binds them (forward/model.h):
// the same LayerWeights with device pointers, each tensor in its checkpoint format (fp8 and fp4
// stay quantized, wo_a too: the codes of the bf16 weight the host Model made of them, as convert.py
// does, which the device widens as it reads them, half the bytes). Built from the
// checkpoint's bytes, or — for benchmarks at sizes no test checkpoint has — from random values
// written on the device over a model whose file holds only the tensor layout (sparse_checkpoint.h).
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda/moe.h"
#include "backend/cuda/device_buffer.h"
#include "forward/model.h"

namespace dsv41::cuda {

class DeviceModel {
 public:
  enum class Values { Checkpoint, Random };
  explicit DeviceModel(const Model& model, Values values = Values::Checkpoint, uint64_t seed = 0);

  const Model& host() const { return model_; }
  const Config& config() const { return model_.config(); }
  const Weight& embed() const { return embed_; }
  const Weight& norm() const { return norm_; }
  const Weight& head() const { return head_; }
  // engram.table / table_scale and the Weights are device pointers; engram.qk is left empty and
  // engram_qk() holds it.
  const LayerWeights& layer(int i) const { return layers_[size_t(i)]; }
  const float* engram_qk(int i) const { return engram_qk_[size_t(i)]; }
  // The layer's routed experts. Their fp8/fp4 matrices live in the table alone (gemm.cuh's tile
  // layout): layer(i).experts keeps their shapes and formats with null pointers.
  const ExpertTable& experts(int i) const { return *experts_[size_t(i)]; }
  // DSpark's own tensors (main_proj, main_norm, norm, the Markov and confidence heads) as device
  // Weights; layer(i), experts(i), attn_sink(i) and rope_freqs(i) hold its stages at i ≥ n_layers.
  const DSparkWeights& dspark() const { return dspark_; }
  const float* attn_sink(int i) const { return sink_[size_t(i)]; }  // [n_heads] fp32
  const float* rope_freqs(int i) const;                               // the layer's RopeTable
  // The vision tower (a model with vision; else empty) as device Weights, placed by walking
  // for_each_vision_tensor; patch_embed zero-padded to padded_columns(3·p²) columns
  // (forward/vision_layout.h), the tensor-core GEMM's K. vision_rope_freqs(): VisionRope's
  // head_dim/4 frequencies, fp32.
  const VisionWeights& vision() const { return vision_; }
  const float* vision_rope_freqs() const { return vision_freqs_; }
  int64_t bytes() const { return bytes_; }
  // The host tensor the device holds for a layer's wo_a: the checkpoint's fp8 codes where it has
  // them in a shape cuda::linear_grouped_widened takes, else the host's bf16 copy.
  static const Weight& placed_wo_a(const AttentionWeights& a, int64_t o_groups);

 private:
  // What a tensor holds in a random model: scaled random values, ones (norms, mHC's scales), zeros
  // (mHC's and the gate's biases, sinks), or the host's values in both modes (RoPE frequencies).
  enum class Fill { Matrix, Ones, Zeros, Host };
  static Fill random_fill(const BlockTensor& t);
  static Fill vision_fill(const std::string& name);
  void place_vision();
  Weight place_padded(const Weight& w, int64_t cols);  // a bf16 matrix with zero columns up to `cols`
  static int64_t tensor_bytes(const BlockTensor& t);
  Weight place(const Weight& w, Fill fill);
  const uint8_t* place_bytes(const uint8_t* host, int64_t bytes, Fill fill, WeightFormat format, int64_t cols, bool scale);
  const float* place_floats(const std::vector<float>& host, Fill fill);

  const Model& model_;
  Values values_;
  uint64_t seed_, tensors_ = 0;
  int64_t bytes_ = 0;
  std::vector<DeviceBuffer<uint8_t>> buffers_;
  Weight embed_, norm_, head_;
  std::vector<LayerWeights> layers_;  // the backbone's, then DSpark's stages (as the host Model's)
  DSparkWeights dspark_;
  std::vector<const float*> engram_qk_, sink_;
  std::vector<std::unique_ptr<ExpertTable>> experts_;
  const float *freqs_window_ = nullptr, *freqs_compressed_ = nullptr;
  VisionWeights vision_;
  const float* vision_freqs_ = nullptr;
};

}  // namespace dsv41::cuda
