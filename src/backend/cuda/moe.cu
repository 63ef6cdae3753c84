// MoE routing and the SwiGLU expert.
//
// Routing (route_kernel): one block of 128 threads per token. The scores of all experts
// (sqrt(softplus(logit / T)) or sigmoid) and the biased scores go to shared memory; then k rounds
// of a block arg-max (best biased score, the lower expert on ties: the CPU's partial_sort order)
// pick the experts best first, and thread 0 normalizes their unbiased scores in that order, as the
// CPU op. Traffic: the logits once (384 × 4 bytes per token for V4.1) plus the bias; the gate's
// product before it is cuda::linear_f32 (384 × 5120 bf16 = 3.9 MB per call).
//
// The expert (expert_ffn): w1 and w3 through cuda::linear (act-quantized x, fp4 weights read in
// place), one elementwise kernel for the clamped SwiGLU and the routing weight (rounded to bf16,
// the activations' dtype), then w2. Traffic per call: the three weights once (3 × 2304 × 5120 / 2
// bytes + scales ≈ 18.4 MB per V4.1 expert at fp4) and 2 × rows × 2304 × 4 for the hidden values.
#include "backend/cuda/moe.h"

#include <climits>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/linear.h"
#include "numerics/types.h"

namespace dsv41::cuda {

namespace {

constexpr int kRouteThreads = 128;
constexpr int kMaxExperts = 4096;
constexpr int kMaxTopk = 32;

// a beats b: higher biased score, or equal and the lower index.
__device__ __forceinline__ bool beats(float va, int a, float vb, int b) { return va > vb || (va == vb && a < b); }

__global__ void __launch_bounds__(kRouteThreads) route_kernel(const float* logits, int E, const float* bias, int k,
                                                              bool sigmoid, float gate_temp, bool norm, float route_scale,
                                                              int32_t* experts, float* weights) {
  extern __shared__ float smem[];
  float* scores = smem;
  float* biased = smem + E;
  __shared__ float warp_value[kRouteThreads / 32];
  __shared__ int warp_index[kRouteThreads / 32];
  __shared__ int order[kMaxTopk];
  const int64_t r = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += kRouteThreads) {
    const float logit = logits[r * E + e] / gate_temp;
    float s;
    if (sigmoid) s = 1.0f / (1.0f + expf(-logit));
    else s = sqrtf(logit > 20.0f ? logit : log1pf(expf(logit)));  // torch's softplus threshold
    scores[e] = s;
    biased[e] = s + bias[e];
  }
  __syncthreads();
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int index = INT_MAX;
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= order[i] == e;
      if (!taken && beats(biased[e], e, best, index)) best = biased[e], index = e;
    }
    for (int o = 16; o > 0; o /= 2) {
      const float v = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int i = __shfl_xor_sync(0xFFFFFFFFu, index, o);
      if (beats(v, i, best, index)) best = v, index = i;
    }
    if (threadIdx.x % 32 == 0) warp_value[threadIdx.x / 32] = best, warp_index[threadIdx.x / 32] = index;
    __syncthreads();
    if (threadIdx.x == 0) {
      best = warp_value[0], index = warp_index[0];
      for (int w = 1; w < kRouteThreads / 32; ++w)
        if (beats(warp_value[w], warp_index[w], best, index)) best = warp_value[w], index = warp_index[w];
      order[j] = index;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float sum = 0;
    for (int j = 0; j < k; ++j) sum += scores[order[j]];
    for (int j = 0; j < k; ++j) {
      float w = scores[order[j]];
      if (norm && k > 1) w /= sum + 1e-20f;  // as the CPU op (not norm_eps: as in training)
      experts[r * k + j] = order[j];
      weights[r * k + j] = w * route_scale;
    }
  }
}

// h = bf16(weight · silu(min(g, L)) · clamp(u, -L, L)) in place of g, the CPU op's expressions.
__global__ void swiglu_kernel(float* g, const float* u, int64_t rows, int64_t inter, float limit,
                              const float* row_weights) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * inter) return;
  float gv = g[i], uv = u[i];
  if (limit > 0) {
    uv = uv < -limit ? -limit : (limit < uv ? limit : uv);  // std::clamp
    gv = limit < gv ? limit : gv;                           // std::min
  }
  float h = gv / (1.0f + expf(-gv)) * uv;
  if (row_weights) h = row_weights[i / inter] * h;
  g[i] = round_bf16(h);
}

}  // namespace

void route_from_logits(const float* logits, int64_t rows, int n_experts, const float* bias, const GateOptions& opt,
                       int32_t* experts, float* weights, cudaStream_t stream) {
  if (rows <= 0) return;
  if (opt.score_func != "sqrtsoftplus" && opt.score_func != "sigmoid")
    fail("cuda::route", "score_func sqrtsoftplus or sigmoid", opt.score_func);
  if (n_experts <= 0 || n_experts > kMaxExperts)
    fail("cuda::route", "1 to 4096 experts", std::to_string(n_experts));
  if (opt.topk <= 0 || opt.topk > kMaxTopk || opt.topk > n_experts)
    fail("cuda::route", "top-k in [1, min(32, experts)]", std::to_string(opt.topk));
  route_kernel<<<unsigned(rows), kRouteThreads, size_t(2 * n_experts) * sizeof(float), stream>>>(
      logits, n_experts, bias, opt.topk, opt.score_func == "sigmoid", opt.gate_temp, opt.norm_topk_prob,
      opt.route_scale, experts, weights);
  check_launch("cuda::route");
}

void route(const float* x, int64_t rows, const Weight& gate, const Weight& bias, const GateOptions& opt,
           int32_t* experts, float* weights, cudaStream_t stream) {
  if (rows <= 0) return;
  if (bias.format != WeightFormat::F32 || bias.rows * bias.cols != gate.rows)
    fail("cuda::route", "an F32 bias of one value per expert", "another bias");
  keep_scratch_pool();
  float* logits = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&logits), size_t(rows * gate.rows) * sizeof(float), stream),
        "cuda::route");
  linear_f32(x, rows, gate, logits, stream);
  route_from_logits(logits, rows, int(gate.rows), reinterpret_cast<const float*>(bias.data), opt, experts, weights,
                    stream);
  check(cudaFreeAsync(logits, stream), "cuda::route");
}

void expert_ffn(const float* x, int64_t rows, const Weight& w1, const Weight& w2, const Weight& w3, float limit,
                const float* row_weights, float* y, cudaStream_t stream) {
  if (rows <= 0) return;
  const int64_t inter = w1.rows, n = rows * inter;
  keep_scratch_pool();
  float *g = nullptr, *u = nullptr;
  check(cudaMallocAsync(reinterpret_cast<void**>(&g), size_t(n) * sizeof(float), stream), "cuda::expert_ffn");
  check(cudaMallocAsync(reinterpret_cast<void**>(&u), size_t(n) * sizeof(float), stream), "cuda::expert_ffn");
  linear(x, rows, w1, g, stream);
  linear(x, rows, w3, u, stream);
  swiglu_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(g, u, rows, inter, limit, row_weights);
  check_launch("cuda::expert_ffn swiglu");
  linear(g, rows, w2, y, stream);
  check(cudaFreeAsync(g, stream), "cuda::expert_ffn");
  check(cudaFreeAsync(u, stream), "cuda::expert_ffn");
}

}  // namespace dsv41::cuda
