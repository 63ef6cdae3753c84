// The trainer's products through cuBLASLt (linear.h), and the bf16 cast of their operands. Blas
// itself takes fp32 operands too (the CUDA optimizers' Newton–Schulz, optim/newton_schulz.cu).
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

// The descriptors of one call, destroyed with it (creating them is a few host microseconds). c is
// null when C is D (D's layout serves both).
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  ~Descriptors() {
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// A column-major [rows, cols] layout with leading dimension ld, and a batch of `batch` such matrices
// `stride` elements apart.
void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                 int64_t stride) {
  lt(cublasLtMatrixLayoutCreate(layout, type, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
  if (batch == 1) return;
  const int32_t count = int32_t(batch);
  lt(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
     "cublasLtMatrixLayoutSetAttribute");
  lt(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
     "cublasLtMatrixLayoutSetAttribute");
}

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
  std::map<std::array<int64_t, 21>, cublasLtMatmulAlgo_t> algos;
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
  if (p.m < 1 || p.n < 1 || p.k < 1)
    fail(where, "m, n, k ≥ 1", std::to_string(p.m) + ", " + std::to_string(p.n) + ", " + std::to_string(p.k));
  if (p.batch < 1 || p.batch > INT32_MAX) fail(where, "a batch of 1 to 2^31 - 1 products", std::to_string(p.batch));
  const bool in_place = p.c == nullptr;  // C is D
  const float* c = in_place ? p.d : p.c;
  const int64_t ldc = in_place ? p.ldd : p.ldc, stride_c = in_place ? p.stride_d : p.stride_c;

  Descriptors desc;
  lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_a = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "cublasLtMatmulDescSetAttribute");
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "cublasLtMatmulDescSetAttribute");
  // Stored shapes (column-major): A is op(A) [m, k] or its transpose, B likewise.
  const cudaDataType_t operands = p.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  make_layout(&desc.a, operands, p.transpose_a ? p.k : p.m, p.transpose_a ? p.m : p.k, p.lda, p.batch, p.stride_a);
  make_layout(&desc.b, operands, p.transpose_b ? p.n : p.k, p.transpose_b ? p.k : p.n, p.ldb, p.batch, p.stride_b);
  make_layout(&desc.d, CUDA_R_32F, p.m, p.n, p.ldd, p.batch, p.stride_d);
  if (!in_place) make_layout(&desc.c, CUDA_R_32F, p.m, p.n, p.ldc, p.batch, p.stride_c);
  const cublasLtMatrixLayout_t c_layout = in_place ? desc.d : desc.c;

  const bool batched = p.batch > 1;
  const int64_t operand_bytes = p.bf16 ? 2 : 4;
  const uint32_t align_a = alignment(p.a, batched ? p.stride_a * operand_bytes : 0);
  const uint32_t align_b = alignment(p.b, batched ? p.stride_b * operand_bytes : 0);
  const uint32_t align_c = alignment(c, batched ? stride_c * 4 : 0), align_d = alignment(p.d, batched ? p.stride_d * 4 : 0);
  const std::array<int64_t, 21> key = {p.bf16,     p.transpose_a, p.transpose_b, p.m,        p.n,       p.k,     p.lda,
                                       p.ldb,      ldc,           p.ldd,         p.stride_a, p.stride_b, stride_c, p.stride_d,
                                       p.batch,    p.beta != 0,   align_a,       align_b,    align_c,   align_d, c == p.d};
  auto found = lt_->algos.find(key);
  if (found == lt_->algos.end()) {
    cublasLtMatmulPreference_t pref;
    lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const size_t ws = kWorkspace;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_d}};
    for (const auto& [attribute, value] : aligns)
      if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value));
    cublasLtMatmulHeuristicResult_t result{};
    int count = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
      status = cublasLtMatmulAlgoGetHeuristic(lt_->handle, desc.op, desc.a, desc.b, c_layout, desc.d, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    lt(status, "cublasLtMatmulAlgoGetHeuristic");
    if (count == 0)
      fail(where, "a cuBLASLt algorithm for the product",
           "none for m " + std::to_string(p.m) + ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k) + ", batch " +
               std::to_string(p.batch));
    found = lt_->algos.emplace(key, result.algo).first;
  }
  lt(cublasLtMatmul(lt_->handle, desc.op, &p.alpha, p.a, desc.a, p.b, desc.b, &p.beta, c, c_layout, p.d, desc.d, &found->second,
                    lt_->workspace, kWorkspace, stream),
     "cublasLtMatmul");
}

void linear_grouped_forward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t G, int64_t Kg, const void* W,
                            int64_t Ng, float* y, cudaStream_t stream) {
  if (M <= 0 || G <= 0 || Ng <= 0) return;
  if (Kg <= 0) {
    cuda::check(cudaMemsetAsync(y, 0, size_t(M * G * Ng) * sizeof(float), stream), "train_cuda::linear_forward");
    return;
  }
  blas.matmul({.bf16 = operands == Operands::Bf16, .transpose_a = true, .m = Ng, .n = M, .k = Kg,
               .a = W, .lda = Kg, .stride_a = Ng * Kg,
               .b = x, .ldb = G * Kg, .stride_b = Kg,
               .beta = 0.0f,
               .d = y, .ldd = G * Ng, .stride_d = Ng, .batch = G},
              stream);
}

void linear_grouped_backward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t G, int64_t Kg, const void* W,
                             int64_t Ng, const void* dy, float* dx, float* dW, cudaStream_t stream) {
  if (M <= 0 || G <= 0 || Kg <= 0 || Ng <= 0) return;
  if (dx)
    blas.matmul({.bf16 = operands == Operands::Bf16, .m = Kg, .n = M, .k = Ng,
                 .a = W, .lda = Kg, .stride_a = Ng * Kg,
                 .b = dy, .ldb = G * Ng, .stride_b = Ng,
                 .beta = 1.0f,
                 .d = dx, .ldd = G * Kg, .stride_d = Kg, .batch = G},
                stream);
  if (dW)
    blas.matmul({.bf16 = operands == Operands::Bf16, .transpose_b = true, .m = Kg, .n = Ng, .k = M,
                 .a = x, .lda = G * Kg, .stride_a = Kg,
                 .b = dy, .ldb = G * Ng, .stride_b = Ng,
                 .beta = 1.0f,
                 .d = dW, .ldd = Kg, .stride_d = Ng * Kg, .batch = G},
                stream);
}

// The plain products are the grouped ones with one group.
void linear_forward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t K, const void* W, int64_t N, float* y,
                    cudaStream_t stream) {
  linear_grouped_forward(blas, operands, x, M, 1, K, W, N, y, stream);
}

void linear_backward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t K, const void* W, int64_t N,
                     const void* dy, float* dx, float* dW, cudaStream_t stream) {
  linear_grouped_backward(blas, operands, x, M, 1, K, W, N, dy, dx, dW, stream);
}

}  // namespace dsv41::train_cuda
