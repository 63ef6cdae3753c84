// The trainer's products through cuBLASLt (linear.h), and the bf16 cast of their operands.
//
// cast_bf16: one thread per value; traffic 6 bytes per value (fp32 read, bf16 written).
// The products: cuBLASLt's bf16 tensor-core GEMMs with an fp32 compute type (CUBLAS_COMPUTE_32F:
// fp32 accumulation, no reduced-precision reduction) and fp32 D; traffic at least
// 2(MK + NK) + 4·MN bytes per product (8·MN when D is added into). The row-major products are
// column-major ones of the transposed matrices (a row-major [r, c] array is a column-major [c, r]
// one): with x [M, K], W [N, K], dy [M, N] row-major,
//   y  = x Wᵀ  : yᵀ [N, M]  = (W as [K, N])ᵀ · (x as [K, M])
//   dx = dy W  : dxᵀ [K, M] = (W as [K, N]) · (dy as [N, M])
//   dW = dyᵀ x : dWᵀ [K, N] = (x as [K, M]) · (dy as [N, M])ᵀ
#include "train/cuda/linear.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"
#include "numerics/types.h"

namespace dsv41::train_cuda {

namespace {

__global__ void cast_bf16_kernel(const float* x, int64_t n, bf16* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = bf16_from_float(x[i]);
}

void lt(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) fail(call, "CUBLAS_STATUS_SUCCESS", cublasLtGetStatusString(status));
}

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address: the
// alignment the chosen algorithm may rely on.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  return uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
}

// cuBLAS's recommended workspace on Hopper.
constexpr size_t kWorkspace = size_t(32) << 20;

// The descriptors of one call, destroyed with it (creating them is a few host microseconds).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  ~Descriptors() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

void cast_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream) {
  if (n <= 0) return;
  cast_bf16_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(x, n, y);
  cuda::check_launch("train_cuda::cast_bf16");
}

struct Blas::Opaque {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  // (transpose a, transpose b, m, n, k, beta ≠ 0, alignments of a, b, d) → the algorithm.
  std::map<std::array<int64_t, 9>, cublasLtMatmulAlgo_t> algos;
};

Blas::Blas() : lt_(new Opaque) {
  lt(cublasLtCreate(&lt_->handle), "cublasLtCreate");
  cuda::check(cudaMalloc(&lt_->workspace, kWorkspace), "train_cuda::Blas workspace");
}

Blas::~Blas() {
  cudaFree(lt_->workspace);
  cublasLtDestroy(lt_->handle);
  delete lt_;
}

void Blas::matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bf16* a, const bf16* b,
                  float beta, float* d, cudaStream_t stream) {
  if (beta != 0.0f && beta != 1.0f) fail("train_cuda::Blas::matmul", "beta 0 or 1", std::to_string(beta));
  Descriptors desc;
  lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "cublasLtMatmulDescSetAttribute");
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "cublasLtMatmulDescSetAttribute");
  // Stored shapes (column-major, packed): A is op(A) [m, k] or its transpose, B likewise.
  const uint64_t a_rows = uint64_t(transpose_a ? k : m), a_cols = uint64_t(transpose_a ? m : k);
  const uint64_t b_rows = uint64_t(transpose_b ? n : k), b_cols = uint64_t(transpose_b ? k : n);
  lt(cublasLtMatrixLayoutCreate(&desc.a, CUDA_R_16BF, a_rows, a_cols, int64_t(a_rows)), "cublasLtMatrixLayoutCreate");
  lt(cublasLtMatrixLayoutCreate(&desc.b, CUDA_R_16BF, b_rows, b_cols, int64_t(b_rows)), "cublasLtMatrixLayoutCreate");
  lt(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, uint64_t(m), uint64_t(n), m), "cublasLtMatrixLayoutCreate");

  const std::array<int64_t, 9> key = {transpose_a, transpose_b, m, n, k, beta != 0.0f, alignment(a), alignment(b),
                                      alignment(d)};
  auto found = lt_->algos.find(key);
  if (found == lt_->algos.end()) {
    cublasLtMatmulPreference_t pref;
    lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = kWorkspace;
    const uint32_t align_a = alignment(a), align_b = alignment(b), align_d = alignment(d);
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
    if (status == CUBLAS_STATUS_SUCCESS)  // C is D (added into in place)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d));
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(lt_->handle, desc.op, desc.a, desc.b, desc.d, desc.d, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    lt(status, "cublasLtMatmulAlgoGetHeuristic");
    if (count == 0)
      fail("train_cuda::Blas::matmul", "a cuBLASLt algorithm for the shape",
           "none for m " + std::to_string(m) + ", n " + std::to_string(n) + ", k " + std::to_string(k));
    found = lt_->algos.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f;
  lt(cublasLtMatmul(lt_->handle, desc.op, &alpha, a, desc.a, b, desc.b, &beta, d, desc.d, d, desc.d, &found->second,
                    lt_->workspace, kWorkspace, stream),
     "cublasLtMatmul");
}

void linear_forward(Blas& blas, const bf16* x, int64_t M, int64_t K, const bf16* W, int64_t N, float* y,
                    cudaStream_t stream) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) {
    cuda::check(cudaMemsetAsync(y, 0, size_t(M * N) * sizeof(float), stream), "train_cuda::linear_forward");
    return;
  }
  blas.matmul(true, false, N, M, K, W, x, 0.0f, y, stream);
}

void linear_backward(Blas& blas, const bf16* x, int64_t M, int64_t K, const bf16* W, int64_t N, const bf16* dy, float* dx,
                     float* dW, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0) return;
  if (dx) blas.matmul(false, false, K, M, N, W, dy, 1.0f, dx, stream);
  if (dW) blas.matmul(false, true, K, N, M, x, dy, 1.0f, dW, stream);
}

}  // namespace dsv41::train_cuda
