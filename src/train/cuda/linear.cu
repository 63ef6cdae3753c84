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
// The grouped form is the same three products for each group g as one strided batch: x_g is x's
// columns g·Kg … (leading dimension G·Kg, the next group Kg further), W_g W's rows g·Ng … (the next
// Ng·Kg further), y_g and dy_g y's and dy's columns g·Ng … (leading dimension G·Ng, the next Ng
// further). A plain linear is the grouped one with G = 1.
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

// The largest power of two (at most 256, cuBLASLt's default assumption) dividing the address and
// the byte stride between a batch's matrices: the alignment the chosen algorithm may rely on.
uint32_t alignment(const void* p, int64_t stride_bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) | uintptr_t(stride_bytes);
  return a == 0 ? 256u : uint32_t(std::min<uintptr_t>(256, a & (~a + 1)));
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
  // (the product's description, its operands' alignments) → the algorithm.
  std::map<std::array<int64_t, 16>, cublasLtMatmulAlgo_t> algos;
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

void Blas::matmul(const Product& p, cudaStream_t stream) {
  const char* where = "train_cuda::Blas::matmul";
  if (p.beta != 0.0f && p.beta != 1.0f) fail(where, "beta 0 or 1", std::to_string(p.beta));
  if (p.batch < 1 || p.batch > INT32_MAX) fail(where, "a batch of 1 to 2^31 - 1 products", std::to_string(p.batch));
  Descriptors desc;
  lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "cublasLtMatmulDescSetAttribute");
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "cublasLtMatmulDescSetAttribute");
  // Stored shapes (column-major): A is op(A) [m, k] or its transpose, B likewise.
  const uint64_t a_rows = uint64_t(p.transpose_a ? p.k : p.m), a_cols = uint64_t(p.transpose_a ? p.m : p.k);
  const uint64_t b_rows = uint64_t(p.transpose_b ? p.n : p.k), b_cols = uint64_t(p.transpose_b ? p.k : p.n);
  lt(cublasLtMatrixLayoutCreate(&desc.a, CUDA_R_16BF, a_rows, a_cols, p.lda), "cublasLtMatrixLayoutCreate");
  lt(cublasLtMatrixLayoutCreate(&desc.b, CUDA_R_16BF, b_rows, b_cols, p.ldb), "cublasLtMatrixLayoutCreate");
  lt(cublasLtMatrixLayoutCreate(&desc.d, CUDA_R_32F, uint64_t(p.m), uint64_t(p.n), p.ldd), "cublasLtMatrixLayoutCreate");
  if (p.batch > 1) {
    const int32_t count = int32_t(p.batch);
    const cublasLtMatrixLayout_t layouts[3] = {desc.a, desc.b, desc.d};
    const int64_t strides[3] = {p.stride_a, p.stride_b, p.stride_d};
    for (int i = 0; i < 3; ++i) {
      lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
         "cublasLtMatrixLayoutSetAttribute");
      lt(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof(int64_t)),
         "cublasLtMatrixLayoutSetAttribute");
    }
  }
  const bool batched = p.batch > 1;
  const uint32_t align_a = alignment(p.a, batched ? p.stride_a * 2 : 0), align_b = alignment(p.b, batched ? p.stride_b * 2 : 0);
  const uint32_t align_d = alignment(p.d, batched ? p.stride_d * 4 : 0);
  const std::array<int64_t, 16> key = {p.transpose_a, p.transpose_b, p.m,        p.n,        p.k,        p.lda,
                                       p.ldb,         p.ldd,         p.stride_a, p.stride_b, p.stride_d, p.batch,
                                       p.beta != 0,   align_a,       align_b,    align_d};
  auto found = lt_->algos.find(key);
  if (found == lt_->algos.end()) {
    cublasLtMatmulPreference_t pref;
    lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = kWorkspace;
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
      fail(where, "a cuBLASLt algorithm for the product",
           "none for m " + std::to_string(p.m) + ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k) + ", batch " +
               std::to_string(p.batch));
    found = lt_->algos.emplace(key, result.algo).first;
  }
  const float alpha = 1.0f;
  lt(cublasLtMatmul(lt_->handle, desc.op, &alpha, p.a, desc.a, p.b, desc.b, &p.beta, p.d, desc.d, p.d, desc.d, &found->second,
                    lt_->workspace, kWorkspace, stream),
     "cublasLtMatmul");
}

void linear_grouped_forward(Blas& blas, const bf16* x, int64_t M, int64_t G, int64_t Kg, const bf16* W, int64_t Ng, float* y,
                            cudaStream_t stream) {
  if (M <= 0 || G <= 0 || Ng <= 0) return;
  if (Kg <= 0) {
    cuda::check(cudaMemsetAsync(y, 0, size_t(M * G * Ng) * sizeof(float), stream), "train_cuda::linear_forward");
    return;
  }
  blas.matmul({.transpose_a = true, .m = Ng, .n = M, .k = Kg,
               .a = W, .lda = Kg, .stride_a = Ng * Kg,
               .b = x, .ldb = G * Kg, .stride_b = Kg,
               .beta = 0.0f,
               .d = y, .ldd = G * Ng, .stride_d = Ng, .batch = G},
              stream);
}

void linear_grouped_backward(Blas& blas, const bf16* x, int64_t M, int64_t G, int64_t Kg, const bf16* W, int64_t Ng,
                             const bf16* dy, float* dx, float* dW, cudaStream_t stream) {
  if (M <= 0 || G <= 0 || Kg <= 0 || Ng <= 0) return;
  if (dx)
    blas.matmul({.m = Kg, .n = M, .k = Ng,
                 .a = W, .lda = Kg, .stride_a = Ng * Kg,
                 .b = dy, .ldb = G * Ng, .stride_b = Ng,
                 .beta = 1.0f,
                 .d = dx, .ldd = G * Kg, .stride_d = Kg, .batch = G},
                stream);
  if (dW)
    blas.matmul({.transpose_b = true, .m = Kg, .n = Ng, .k = M,
                 .a = x, .lda = G * Kg, .stride_a = Kg,
                 .b = dy, .ldb = G * Ng, .stride_b = Ng,
                 .beta = 1.0f,
                 .d = dW, .ldd = Kg, .stride_d = Ng * Kg, .batch = G},
                stream);
}

void linear_forward(Blas& blas, const bf16* x, int64_t M, int64_t K, const bf16* W, int64_t N, float* y,
                    cudaStream_t stream) {
  linear_grouped_forward(blas, x, M, 1, K, W, N, y, stream);
}

void linear_backward(Blas& blas, const bf16* x, int64_t M, int64_t K, const bf16* W, int64_t N, const bf16* dy, float* dx,
                     float* dW, cudaStream_t stream) {
  linear_grouped_backward(blas, x, M, 1, K, W, N, dy, dx, dW, stream);
}

}  // namespace dsv41::train_cuda
