#pragma once
// Newton–Schulz's products (newton_schulz.h) through cuBLASLt: fp32 operands, or bf16 ones on the
// tensor cores; fp32 accumulation either way (CUBLAS_COMPUTE_32F, which allows no TF32 or bf16
// shortcut of fp32 operands), fp32 C and D, and the epilogue D = α · op(A) · op(B) + β · C that folds
// the iteration's linear combinations into the products. (train_cuda::Blas, linear.h, takes bf16
// operands only, D = C and β ∈ {0, 1}.) Which precision Muon uses: docs/training.md, "The CUDA
// optimizers".
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda::optim {

class NsBlas {
 public:
  // Row-major, dense: D [m, n] = alpha · op(A) · op(B) + beta · C for each of `batch` matrices.
  // op(A) [m, k]: A is stored [m, k], or [k, m] when transpose_a; op(B) [k, n] likewise. C and D
  // [m, n]; C may be D, or null when beta is 0. stride_*: elements from one matrix of the batch to
  // the next. bf16: A and B are bf16 (uint16_t, the high half of an fp32), else fp32.
  struct Product {
    bool bf16 = false;
    bool transpose_a = false, transpose_b = false;
    int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    int64_t stride_a = 0;
    const void* b = nullptr;
    int64_t stride_b = 0;
    float alpha = 1, beta = 0;
    const float* c = nullptr;
    int64_t stride_c = 0;
    float* d = nullptr;
    int64_t stride_d = 0;
    int64_t batch = 1;
  };

  // One algorithm per product description (shape, transposes, batch, strides, operand alignment),
  // chosen once and kept: a product gives the same bits at every call (cuBLAS's reproducibility
  // guarantee for cublasLtMatmul with a workspace of the caller's, one GPU model and toolkit).
  // Not thread-safe; calls on one stream at a time.
  NsBlas();
  ~NsBlas();
  NsBlas(const NsBlas&) = delete;
  NsBlas& operator=(const NsBlas&) = delete;

  void matmul(const Product& p, cudaStream_t stream);

 private:
  struct Opaque;
  Opaque* lt_;
};

}  // namespace dsv41::train_cuda::optim
