// Newton–Schulz's products through cuBLASLt (ns_blas.h).
//
// The row-major products are column-major ones of the transposed matrices (a row-major [r, c]
// array is a column-major [c, r] one): D = op(A) op(B) + βC row-major is Dᵀ = op(B)ᵀ op(A)ᵀ + βCᵀ
// column-major, so cuBLASLt's first operand is our B (its stored [n, k], or [k, n] transposed) and
// its second our A (stored [k, m], or [m, k] transposed), with its m and n swapped.
#include "train/cuda/optim/ns_blas.h"

#include <cublasLt.h>

#include <algorithm>
#include <array>
#include <map>
#include <string>

#include "backend/cuda/check.h"
#include "base/error.h"

namespace dsv41::train_cuda::optim {

namespace {

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

struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;
  ~Descriptors() {
    for (cublasLtMatrixLayout_t l : {a, b, c, d})
      if (l) cublasLtMatrixLayoutDestroy(l);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t batch,
                 int64_t stride) {
  lt(cublasLtMatrixLayoutCreate(layout, type, rows, cols, int64_t(rows)), "cublasLtMatrixLayoutCreate");
  if (batch == 1) return;
  const int32_t count = int32_t(batch);
  lt(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
     "cublasLtMatrixLayoutSetAttribute");
  lt(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
     "cublasLtMatrixLayoutSetAttribute");
}

}  // namespace

struct NsBlas::Opaque {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::map<std::array<int64_t, 17>, cublasLtMatmulAlgo_t> algos;
};

NsBlas::NsBlas() : lt_(new Opaque) {
  lt(cublasLtCreate(&lt_->handle), "cublasLtCreate");
  cuda::check(cudaMalloc(&lt_->workspace, kWorkspace), "train_cuda::optim::NsBlas workspace");
}

NsBlas::~NsBlas() {
  cudaFree(lt_->workspace);
  cublasLtDestroy(lt_->handle);
  delete lt_;
}

void NsBlas::matmul(const Product& p, cudaStream_t stream) {
  const char* where = "train_cuda::optim::NsBlas::matmul";
  if (p.m < 1 || p.n < 1 || p.k < 1)
    fail(where, "m, n, k ≥ 1", std::to_string(p.m) + ", " + std::to_string(p.n) + ", " + std::to_string(p.k));
  if (p.batch < 1 || p.batch > INT32_MAX) fail(where, "a batch of 1 to 2^31 - 1 products", std::to_string(p.batch));
  if (p.beta != 0.0f && !p.c) fail(where, "a C matrix for beta " + std::to_string(p.beta), "none");
  const float* c = p.c ? p.c : p.d;
  const int64_t stride_c = p.c ? p.stride_c : p.stride_d;

  Descriptors desc;
  lt(cublasLtMatmulDescCreate(&desc.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t op_first = p.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = p.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)),
     "cublasLtMatmulDescSetAttribute");
  lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)),
     "cublasLtMatmulDescSetAttribute");
  // Column-major stored shapes: our B as [n, k] (or [k, n]), our A as [k, m] (or [m, k]), C and D [n, m].
  const cudaDataType_t operands = p.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  make_layout(&desc.a, operands, uint64_t(p.transpose_b ? p.k : p.n), uint64_t(p.transpose_b ? p.n : p.k), p.batch, p.stride_b);
  make_layout(&desc.b, operands, uint64_t(p.transpose_a ? p.m : p.k), uint64_t(p.transpose_a ? p.k : p.m), p.batch, p.stride_a);
  make_layout(&desc.c, CUDA_R_32F, uint64_t(p.n), uint64_t(p.m), p.batch, stride_c);
  make_layout(&desc.d, CUDA_R_32F, uint64_t(p.n), uint64_t(p.m), p.batch, p.stride_d);

  const bool batched = p.batch > 1;
  const int64_t operand_bytes = p.bf16 ? 2 : 4;
  const uint32_t align_a = alignment(p.b, batched ? p.stride_b * operand_bytes : 0);
  const uint32_t align_b = alignment(p.a, batched ? p.stride_a * operand_bytes : 0);
  const uint32_t align_c = alignment(c, batched ? stride_c * 4 : 0), align_d = alignment(p.d, batched ? p.stride_d * 4 : 0);
  const std::array<int64_t, 17> key = {p.bf16,     p.transpose_a, p.transpose_b, p.m,     p.n,     p.k,
                                       p.stride_a, p.stride_b,    stride_c,      p.stride_d, p.batch, p.beta != 0,
                                       align_a,    align_b,       align_c,       align_d,  c == p.d};
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
      status = cublasLtMatmulAlgoGetHeuristic(lt_->handle, desc.op, desc.a, desc.b, desc.c, desc.d, pref, 1, &result, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    lt(status, "cublasLtMatmulAlgoGetHeuristic");
    if (count == 0)
      fail(where, "a cuBLASLt algorithm for the product",
           "none for m " + std::to_string(p.m) + ", n " + std::to_string(p.n) + ", k " + std::to_string(p.k) + ", batch " +
               std::to_string(p.batch));
    found = lt_->algos.emplace(key, result.algo).first;
  }
  lt(cublasLtMatmul(lt_->handle, desc.op, &p.alpha, p.b, desc.a, p.a, desc.b, &p.beta, c, desc.c, p.d, desc.d, &found->second,
                    lt_->workspace, kWorkspace, stream),
     "cublasLtMatmul");
}

}  // namespace dsv41::train_cuda::optim
