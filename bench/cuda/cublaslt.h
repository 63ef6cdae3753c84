#pragma once
// cuBLASLt as the peer of our prefill GEMMs in cuda_kernels_bench: y[M, N] = x[M, K] · Wᵀ with
// both operands K-contiguous (cuBLASLt's "TN" form, the one its fp8 kernels take), in
//   bf16 × bf16 → fp32 (the peer of gemm_bf16.cu), or
//   e4m3 × e4m3 → bf16 with one fp32 scale per tensor (the peer of gemm.cu, whose 32 × 32 block
//   scales cuBLASLt's per-tensor form does not have: the peer does less work than ours).
// `groups` > 1: a strided batch, as linear_grouped (x [M, groups·K], group g's columns g·K ..;
// W [groups·N, K]; y [M, groups·N]). The heuristic's first algorithm, a 32 MB workspace.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "base/error.h"

namespace dsv41::bench {

class LtGemm {
 public:
  enum class Kind { Bf16, Fp8 };

  LtGemm(Kind kind, int M, int N, int K, int groups = 1) {
    lt(cublasLtCreate(&handle_), "cublasLtCreate");
    const bool fp8 = kind == Kind::Fp8;
    const cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, out = fp8 ? CUDA_R_16BF : CUDA_R_32F;
    lt(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t)), "cublasLtMatmulDescSetAttribute");
    lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof(n)), "cublasLtMatmulDescSetAttribute");
    // Column-major: C [N, M] = Wᵀ-as-stored [K, N]ᵀ · x-as-stored [K, M].
    lt(cublasLtMatrixLayoutCreate(&a_, in, K, N, K), "cublasLtMatrixLayoutCreate");
    lt(cublasLtMatrixLayoutCreate(&b_, in, K, M, int64_t(groups) * K), "cublasLtMatrixLayoutCreate");
    lt(cublasLtMatrixLayoutCreate(&c_, out, N, M, int64_t(groups) * N), "cublasLtMatrixLayoutCreate");
    if (groups > 1) {
      const int64_t strides[3] = {int64_t(N) * K, K, N};
      cublasLtMatrixLayout_t layouts[3] = {a_, b_, c_};
      for (int i = 0; i < 3; ++i) {
        lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &groups, sizeof(groups)), "cublasLtMatrixLayoutSetAttribute");
        lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(int64_t)), "cublasLtMatrixLayoutSetAttribute");
      }
    }
    if (fp8) {
      check(cudaMalloc(&scales_, 2 * sizeof(float)), "cuBLASLt scales");
      const float one[2] = {1.0f, 1.0f};
      check(cudaMemcpy(scales_, one, sizeof(one), cudaMemcpyHostToDevice), "cuBLASLt scales");
      const float *sa = scales_, *sb = scales_ + 1;
      lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)), "cublasLtMatmulDescSetAttribute");
      lt(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)), "cublasLtMatmulDescSetAttribute");
    }
    check(cudaMalloc(&workspace_, kWorkspace), "cuBLASLt workspace");
    cublasLtMatmulPreference_t pref;
    lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = kWorkspace;
    lt(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "cublasLtMatmulPreferenceSetAttribute");
    int found = 0;
    lt(cublasLtMatmulAlgoGetHeuristic(handle_, desc_, a_, b_, c_, c_, pref, 1, &algo_, &found), "cublasLtMatmulAlgoGetHeuristic");
    cublasLtMatmulPreferenceDestroy(pref);
    if (found == 0) fail("cuBLASLt", "an algorithm for the shape", "none");
  }
  ~LtGemm() {
    cudaFree(workspace_), cudaFree(scales_);
    cublasLtMatrixLayoutDestroy(a_), cublasLtMatrixLayoutDestroy(b_), cublasLtMatrixLayoutDestroy(c_);
    cublasLtMatmulDescDestroy(desc_), cublasLtDestroy(handle_);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  // y = x · wᵀ: x [M, K], w [N, K] (bf16 or e4m3 codes), y [M, N] (fp32 or bf16).
  void run(const void* x, const void* w, void* y, cudaStream_t stream = nullptr) {
    const float alpha = 1.0f, beta = 0.0f;
    lt(cublasLtMatmul(handle_, desc_, &alpha, w, a_, x, b_, &beta, y, c_, y, c_, &algo_.algo, workspace_, kWorkspace, stream), "cublasLtMatmul");
  }

 private:
  static constexpr size_t kWorkspace = size_t(32) << 20;
  static void lt(cublasStatus_t s, const char* call) {
    if (s != CUBLAS_STATUS_SUCCESS) fail(call, "CUBLAS_STATUS_SUCCESS", "status " + std::to_string(int(s)));
  }
  static void check(cudaError_t e, const char* where) {
    if (e != cudaSuccess) fail(where, "cudaSuccess", cudaGetErrorString(e));
  }

  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulHeuristicResult_t algo_{};
  void* workspace_ = nullptr;
  float* scales_ = nullptr;
};

}  // namespace dsv41::bench
