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
// shape (and operand alignment), chosen once: a product of a given shape gives the same bits at
// every call (cuBLAS's reproducibility guarantee for cublasLtMatmul with a workspace of the
// caller's, on one GPU model and toolkit). Not thread-safe; calls on one stream at a time.
class Blas {
 public:
  Blas();
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Column-major D [m, n] = op(A) · op(B) + beta · D, op(A) [m, k], op(B) [k, n], each matrix
  // packed (leading dimension = its stored row count); bf16 A and B, fp32 D; beta 0 or 1.
  void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, const bf16* a, const bf16* b,
              float beta, float* d, cudaStream_t stream);

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

}  // namespace dsv41::train_cuda
