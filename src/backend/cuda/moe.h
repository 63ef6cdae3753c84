#pragma once
// Mixture of experts on the GPU, as backend/cpu/moe.h: routing (gate logits, sqrt-softplus or
// sigmoid scores, top-k by score + bias, normalized weights) and the clamped SwiGLU expert over
// the checkpoint's fp4/fp8 weights read in place; and the whole MoE sub-layer of one layer
// (forward.cpp's moe()) as one op whose routing never leaves the device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "model/gate.h"
#include "model/weight.h"

namespace dsv41::cuda {

// As dsv41::route (without `biased`): experts [rows, k] best first, weights [rows, k]. x [rows, dim]
// device; gate a device Weight (F32 or BF16, [experts, dim]); bias a device F32 Weight [experts];
// experts ≤ 4096, k ≤ 32. forced [rows, k] (device, ids in [0, experts)), optional: those experts
// are output instead of the chosen ones, weighted the same way. bias_vl (a device F32 Weight
// [experts]) and image_rows [rows] (device), optional together: a row with image_rows[r] != 0 ranks
// by score + bias_vl instead (an image span's row, docs/vision.md §8), as dsv41::route.
void route(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
           int32_t* experts, float* weights, cudaStream_t stream = nullptr, const int32_t* forced = nullptr,
           const Weight* bias_vl = nullptr, const uint8_t* image_rows = nullptr);

// The routing step alone, from the gate's fp32 logits [rows, n_experts] (what route() runs after
// cuda::linear_f32). bias: device [n_experts]; bias_vl likewise, for the rows with image_rows[r] != 0
// (both null, or both set).
void route_from_logits(const float* logits, int64_t rows, int n_experts, const float* bias, const GateOptions& opt,
                       int32_t* experts, float* weights, cudaStream_t stream = nullptr,
                       const int32_t* forced = nullptr, const float* bias_vl = nullptr, const uint8_t* image_rows = nullptr);

// As dsv41::expert_ffn: y [rows, dim] = w2(bf16(weight · silu(min(w1 x, L)) · clamp(w3 x, -L, L))),
// the clamp when limit > 0, row_weights [rows] (device) when given. Device pointers and weights.
void expert_ffn(const float* x, int64_t rows, const Weight& w1, const Weight& w2, const Weight& w3, float limit,
                const float* row_weights, float* y, cudaStream_t stream = nullptr);

// The routed experts of one layer: their weights' device pointers in a device array, which moe()
// indexes by the expert ids the routing wrote (made once per layer). The fp8/fp4 matrices are
// copied into gemm.cuh's tile layout, which the table owns (the given weights may be freed once it
// is made; docs/formats.md); bf16 ones are read where they are. Every expert has the same formats
// and shapes: w1, w3 [inter, dim] and w2 [dim, inter], w1 and w3 in one format, each of FP4, FP8
// or BF16. Making the table synchronizes the device.
class ExpertTable {
 public:
  ExpertTable(const std::vector<Weight>& w1, const std::vector<Weight>& w2, const std::vector<Weight>& w3);
  ~ExpertTable();
  ExpertTable(const ExpertTable&) = delete;
  ExpertTable& operator=(const ExpertTable&) = delete;

  int experts() const { return experts_; }
  int64_t dim() const { return w1_.cols; }
  int64_t inter() const { return w1_.rows; }
  // Expert 0's weights: the format and shape of them all.
  const Weight& w1() const { return w1_; }
  const Weight& w2() const { return w2_; }
  const Weight& w3() const { return w3_; }
  const void* device() const { return table_; }  // gemm::ExpertPointers[experts] (gemm.cuh)
  // Every expert's weights readable by the tensor-core path (gemm::aligned).
  bool aligned() const { return aligned_; }
  int64_t bytes() const { return bytes_; }  // the tile-layout copies' device bytes

 private:
  int experts_ = 0;
  bool aligned_ = true;
  Weight w1_, w2_, w3_;
  void* table_ = nullptr;
  uint8_t* tiles_ = nullptr;
  int64_t bytes_ = 0;
};

// y [rows, dim] (bf16 values) = the MoE sub-layer as forward.cpp's moe(): route each row of x
// (gate [E, dim] F32/BF16, bias F32 [E], E = routed.experts()), or take `forced` [rows, k] (device,
// ids in [0, E), or nullptr) weighted the same way; each routed expert's expert_ffn on its rows
// with the row's routing weight; their outputs summed in fp32 in ascending expert id order from
// 0.0f; + the shared expert's output (s1, s3 [inter_s, dim], s2 [dim, inter_s], FP4/FP8/BF16, no
// row weight); rounded to bf16. experts / weights [rows, k] (device) receive the routing.
// Everything on `stream`: no host synchronization and nothing on the host that depends on the
// routing (the grids are sized from rows, k and E; kernels exit early on the device's counts), so
// the call can be captured in a CUDA graph. Scratch comes from cudaMallocAsync on `stream`.
//
// How the experts run (the tests and benchmarks pick; the engine takes `automatic`):
//   gemv          the grouped GEMV, each expert's weights read once per tile of ≤ 8 of its rows;
//   tensor_cores  the grouped tensor-core GEMM (gemm.cuh), once per tile of ≤ 128 rows; needs
//                 fp8/fp4 routed weights with dim and inter multiples of 128;
//   automatic     gemv for one row (its tiles of one entry stream the weights at ~1.2 TB/s, twice
//                 the tensor-core path's rate there), else tensor_cores where usable (from 8 rows
//                 on 1.4× to 4× the GEMV's speed in ops_moe_test's graph timings, at 1 to 24 rows
//                 per expert). The shared expert takes cuda::linear's GEMMs from 64 rows on.
//
// bias_vl, image_rows: as route()'s (rows of image spans rank by score + bias_vl).
enum class MoePath { automatic, gemv, tensor_cores };
void moe(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
         const ExpertTable& routed, const Weight& s1, const Weight& s2, const Weight& s3, float limit,
         const int32_t* forced, int32_t* experts, float* weights, float* y, cudaStream_t stream = nullptr,
         MoePath path = MoePath::automatic, const Weight* bias_vl = nullptr, const uint8_t* image_rows = nullptr);

}  // namespace dsv41::cuda
