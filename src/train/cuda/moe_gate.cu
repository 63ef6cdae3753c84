// The MoE gate after its product (moe_gate.h): one block per row. Forward: the scores and biased
// scores in parallel into shared memory, then one thread chooses the top k by k scans over the
// experts (strict > in index order: ties to the lower index, as the CPU's partial_sort orders
// them; k · experts compares, a few thousand) and weights them. Backward: the row zeroed, then one
// thread writes the k chosen entries. Traffic: the logits read and the scores written (forward),
// dlogits written (backward): 4 bytes per expert each. The CPU op's operations in its order, with
// CUDA's full-precision expf, log1pf and sqrtf.
#include "train/cuda/moe_gate.h"

#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"

namespace dsv41::train_cuda {

namespace {

constexpr int kThreads = 128;
// torch's softplus threshold: above it softplus is the identity.
constexpr float kSoftplusThreshold = 20.0f;

__device__ inline float sigmoid(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

__device__ inline float score(float z, bool sigmoid_scores) {
  if (sigmoid_scores) return sigmoid(z);
  return sqrtf(z > kSoftplusThreshold ? z : log1pf(expf(z)));
}

__device__ inline float score_derivative(float z, float s, bool sigmoid_scores) {
  if (sigmoid_scores) return __fmul_rn(s, __fsub_rn(1.0f, s));
  return __fdiv_rn(z > kSoftplusThreshold ? 1.0f : sigmoid(z), __fmul_rn(2.0f, s));
}

// Dynamic shared memory: the scores, then the biased scores [n_experts] each.
__global__ void __launch_bounds__(kThreads) forward_kernel(const float* logits, int64_t n_experts, const float* bias,
                                                           GateParams p, const int32_t* forced, float* scores,
                                                           int32_t* experts, float* weights) {
  extern __shared__ float shared[];
  float *s = shared, *biased = shared + n_experts;
  const int64_t r = blockIdx.x;
  for (int64_t e = threadIdx.x; e < n_experts; e += kThreads) {
    s[e] = score(__fdiv_rn(logits[r * n_experts + e], p.temp), p.sigmoid_scores);
    scores[r * n_experts + e] = s[e];
    biased[e] = __fadd_rn(s[e], bias[e]);
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  int32_t* chosen = experts + r * p.topk;
  for (int j = 0; j < p.topk; ++j) {
    int32_t best = -1;
    if (forced) {
      best = forced[r * p.topk + j];
    } else {
      for (int32_t e = 0; e < int32_t(n_experts); ++e) {
        bool taken = false;
        for (int l = 0; l < j; ++l) taken = taken || chosen[l] == e;
        if (!taken && (best < 0 || biased[e] > biased[best])) best = e;
      }
    }
    chosen[j] = best;
  }
  const bool valid_choice = [&] {
    for (int j = 0; j < p.topk; ++j)
      if (chosen[j] < 0 || chosen[j] >= n_experts) return false;
    return true;
  }();
  float sum = 0;
  for (int j = 0; j < p.topk && valid_choice; ++j) sum = __fadd_rn(sum, s[chosen[j]]);
  for (int j = 0; j < p.topk; ++j) {
    if (!valid_choice) {
      weights[r * p.topk + j] = __int_as_float(0x7FC00000);
      continue;
    }
    const float se = s[chosen[j]];
    const float w = p.normalized ? __fdiv_rn(se, __fadd_rn(sum, 1e-20f)) : se;
    weights[r * p.topk + j] = __fmul_rn(w, p.route_scale);
  }
}

__global__ void __launch_bounds__(kThreads) backward_kernel(const float* logits, const float* scores, int64_t n_experts,
                                                            const int32_t* experts, const float* dweights, GateParams p,
                                                            float* dlogits) {
  const int64_t r = blockIdx.x;
  float* dl = dlogits + r * n_experts;
  for (int64_t e = threadIdx.x; e < n_experts; e += kThreads) dl[e] = 0.0f;
  __syncthreads();
  if (threadIdx.x != 0) return;
  const float* s = scores + r * n_experts;
  const int32_t* chosen = experts + r * p.topk;
  const float* dw = dweights + r * p.topk;
  float sum = 0, weighted = 0;  // S − 1e-20 and Σ_l dw_l s_l
  for (int j = 0; j < p.topk; ++j) {
    sum = __fadd_rn(sum, s[chosen[j]]);
    weighted = __fadd_rn(weighted, __fmul_rn(dw[j], s[chosen[j]]));
  }
  const float S = __fadd_rn(sum, 1e-20f);
  for (int j = 0; j < p.topk; ++j) {
    const int32_t e = chosen[j];
    const float ds = p.normalized ? __fmul_rn(p.route_scale, __fsub_rn(__fdiv_rn(dw[j], S), __fdiv_rn(weighted, __fmul_rn(S, S))))
                                  : __fmul_rn(p.route_scale, dw[j]);
    const float z = __fdiv_rn(logits[r * n_experts + e], p.temp);
    dl[e] = __fadd_rn(dl[e], __fdiv_rn(__fmul_rn(ds, score_derivative(z, s[e], p.sigmoid_scores)), p.temp));
  }
}

void check_params(const GateParams& p, int64_t n_experts, const char* where) {
  if (p.topk < 1 || p.topk > n_experts)
    fail(where, "topk in [1, " + std::to_string(n_experts) + "]", std::to_string(p.topk));
  if (size_t(2 * n_experts) * sizeof(float) > size_t(48 << 10))
    fail(where, "at most 6144 experts", std::to_string(n_experts));
}

}  // namespace

void gate_forward(const float* logits, int64_t rows, int64_t n_experts, const float* bias, const GateParams& p,
                  const int32_t* forced, float* scores, int32_t* experts, float* weights, cudaStream_t stream) {
  check_params(p, n_experts, "train_cuda::gate_forward");
  if (rows <= 0) return;
  forward_kernel<<<unsigned(rows), kThreads, size_t(2 * n_experts) * sizeof(float), stream>>>(logits, n_experts, bias, p, forced,
                                                                                             scores, experts, weights);
  cuda::check_launch("train_cuda::gate_forward");
}

void gate_backward(const float* logits, const float* scores, int64_t rows, int64_t n_experts, const int32_t* experts,
                   const float* dweights, const GateParams& p, float* dlogits, cudaStream_t stream) {
  check_params(p, n_experts, "train_cuda::gate_backward");
  if (rows <= 0) return;
  backward_kernel<<<unsigned(rows), kThreads, 0, stream>>>(logits, scores, n_experts, experts, dweights, p, dlogits);
  cuda::check_launch("train_cuda::gate_backward");
}

}  // namespace dsv41::train_cuda
