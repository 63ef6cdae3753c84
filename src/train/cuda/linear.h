#pragma once
// The trainer's products on the tensor cores (docs/training.md, "The CUDA op set"): bf16 operands,
// fp32 accumulation and fp32 results, through cuBLASLt. The mirror of src/train/grad/linear.h:
//
//   y = x Wᵀ        dx += dy W        dW += dyᵀ x
//
// with x [M, K], W [N, K] (torch's [out, in]) and dy [M, N] row-major. The operands are bf16 copies
// (cast_bf16) of fp32 tensors: the master weights, the activations, the output's gradient. The casts
// are straight-through: the backward's results are the gradients of the fp32 tensors the copies
// were made from, as torch's autocast has them.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace dsv41::train_cuda {

// bf16 values as stored: the high half of an fp32.
using bf16 = uint16_t;

// y [n] = bf16(x [n]), round to nearest even (numerics/types.h bf16_from_float). y may not be x.
void cast_bf16(const float* x, int64_t n, bf16* y, cudaStream_t stream = nullptr);

// A cuBLASLt handle, its workspace and the algorithm it chose for each shape. One algorithm per
// product description (shape, leading dimensions, batch, operand alignment), chosen once: a product
// gives the same bits at every call (cuBLAS's reproducibility guarantee for cublasLtMatmul with a
// workspace of the caller's, on one GPU model and toolkit). Not thread-safe; calls on one stream at
// a time.
class Blas {
 public:
  // Column-major D [m, n] = op(A) · op(B) + beta · D, op(A) [m, k], op(B) [k, n], for each of
  // `batch` matrices; A and B bf16, D fp32, beta 0 or 1. ld*: elements from one stored column to the
  // next; stride_*: elements from one matrix of the batch to the next.
  struct Product {
    bool transpose_a = false, transpose_b = false;
    int64_t m = 0, n = 0, k = 0;
    const bf16* a = nullptr;
    int64_t lda = 0, stride_a = 0;
    const bf16* b = nullptr;
    int64_t ldb = 0, stride_b = 0;
    float beta = 0;
    float* d = nullptr;
    int64_t ldd = 0, stride_d = 0;
    int64_t batch = 1;
  };

  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  void matmul(const Product& p, cudaStream_t stream);

 private:
  struct Opaque;
  Opaque* lt_;
};

// y [M, N] = x [M, K] · Wᵀ (overwritten). K = 0 gives zeros.
void linear_forward(Blas& blas, const bf16* x, int64_t M, int64_t K, const bf16* W, int64_t N, float* y,
                    cudaStream_t stream = nullptr);

// dx [M, K] += dy W and dW [N, K] += dyᵀ x; either may be nullptr (not wanted). x, W: the forward's
// bf16 operands; dy: bf16 of the output's fp32 gradient.
void linear_backward(Blas& blas, const bf16* x, int64_t M, int64_t K, const bf16* W, int64_t N, const bf16* dy, float* dx,
                     float* dW, cudaStream_t stream = nullptr);

// The grouped low-rank output (Attention's wo_a, grad::linear_grouped_*): x [M, G, Kg], group g
// through W's rows [g·Ng, (g+1)·Ng) (W [G·Ng, Kg]), y [M, G, Ng]: block-diagonal, one strided batch
// of G products (no gather of a group's columns).
void linear_grouped_forward(Blas& blas, const bf16* x, int64_t M, int64_t G, int64_t Kg, const bf16* W, int64_t Ng, float* y,
                            cudaStream_t stream = nullptr);

// dx [M, G, Kg] += dy_g W_g and dW_g [Ng, Kg] += dy_gᵀ x_g per group; either may be nullptr.
void linear_grouped_backward(Blas& blas, const bf16* x, int64_t M, int64_t G, int64_t Kg, const bf16* W, int64_t Ng,
                             const bf16* dy, float* dx, float* dW, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
