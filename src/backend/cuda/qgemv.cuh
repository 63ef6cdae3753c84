#pragma once
// The GEMV of cuda::linear over fp8/fp4 weights (qgemv.cu): one or two activation rows on the
// tensor cores (mma.sync over the codes as f16), the activation quantization folded in. Internal to
// the CUDA backend: linear.cu calls it where the GEMM (gemm.cuh) does not run.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/gemm.cuh"
#include "model/weight.h"

namespace dsv41::cuda::qgemv {

using gemm::ExpertPointers;

// The activation rows one pass over the weight serves; more rows take several passes.
inline constexpr int64_t kMaxRows = 2;

// y[M, N] = bf16(act_quant(x) · Wᵀ) for an fp8/fp4 weight with K a multiple of 32, the CPU op's
// precision flow (cuda::linear's contract).
void linear(const float* x, int64_t M, const Weight& w, float* y, cudaStream_t stream);

// What one launch of cuda::moe's expert GEMVs works on (moe.cu's grouped_kernel, and here the one-
// token form). Routed: tile t of the route's or bucket_kernel's (none when t ≥ *tile_count), its
// entries at list[first ...], weights table[expert]. Dense (tiles == nullptr, the shared expert):
// tile t = rows t·MT .. of dense_rows, entry = row, weights `fixed`.
struct GroupedArgs {
  const int4* tiles;
  const int* tile_count;
  const int32_t* list;
  int64_t dense_rows;
  int k;            // up: the x row of entry i is i / k (1 when dense)
  const float* x;   // up: the layer's input [rows, K]; down: h [entries in list order, K]
  int64_t K, N;     // the weights' input and output features
  const ExpertPointers* table;
  ExpertPointers fixed;
  const float* weights;  // up: the routing weight of entry i, or nullptr (dense: none)
  float limit;
  float* h;        // up's output [entries in list order, N]
  uint16_t* ye;    // down's output [entry, N], bf16
};

// The expert GEMVs over tiles of one entry (one token: the MoE at decode batch 1) for fp8/fp4
// experts, `entries` grid rows (the most tiles). up: h[pos, n] = swiglu(bf16(w1[n]·xq),
// bf16(w3[n]·xq)) with the entry's routing weight; down: ye[entry, n] = bf16(w2[n]·hq).
void experts_up(WeightFormat f, const GroupedArgs& a, int64_t entries, cudaStream_t stream);
void experts_down(WeightFormat f, const GroupedArgs& a, int64_t entries, cudaStream_t stream);

}  // namespace dsv41::cuda::qgemv
