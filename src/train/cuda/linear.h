#pragma once
// The trainer's products on the tensor cores (docs/training.md, "The CUDA op set"): bf16 operands,
// fp32 accumulation and fp32 results, through cuBLASLt (Blas, which runs the CUDA optimizers'
// Newton–Schulz products too). The mirror of src/train/grad/linear.h:
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

// A cuBLASLt handle, its workspace and the algorithm it chose for each product description: the
// trainer's products (bf16 operands on the tensor cores) and Newton–Schulz's (optim/newton_schulz.h:
// fp32 operands, or bf16 ones). Every product accumulates in fp32 (CUBLAS_COMPUTE_32F, which allows
// no TF32 or bf16 shortcut of fp32 operands) into fp32 C and D, and its epilogue is
// D = α · op(A) · op(B) + β · C. One algorithm per product description (shape, leading dimensions,
// strides, batch, operand alignment), chosen once: a product gives the same bits at every call
// (cuBLAS's reproducibility guarantee for cublasLtMatmul with a workspace of the caller's, on one
// GPU model and toolkit). Not thread-safe; calls on one stream at a time.
class Blas {
 public:
  // Column-major D [m, n] = alpha · op(A) · op(B) + beta · C, op(A) [m, k], op(B) [k, n], m, n, k ≥ 1,
  // for each of `batch` matrices. A and B bf16 when `bf16`, else fp32. C [m, n] fp32; null: C is D
  // (beta 0 overwrites D, beta 1 adds into it). D fp32. ld*: elements from one stored column to the
  // next; stride_*: elements from one matrix of the batch to the next.
  struct Product {
    bool bf16 = false;
    bool transpose_a = false, transpose_b = false;
    int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    int64_t lda = 0, stride_a = 0;
    const void* b = nullptr;
    int64_t ldb = 0, stride_b = 0;
    float alpha = 1, beta = 0;
    const float* c = nullptr;
    int64_t ldc = 0, stride_c = 0;
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

// The products' operand precision. Bf16: the masters' bf16 copies and each activation (and, in the
// backward, each incoming gradient) cast as it enters a product — the tensor cores, what training
// runs. Fp32: the fp32 arrays themselves (no cast; fp32 accumulation, no TF32) — for the small
// products whose outputs feed a normalization or a choice rather than a sum, where bf16's 2⁻⁹ would
// move them far past the CPU's rounding (the MoE gate; mHC's mixes, mhc.h: (2 + hc)·hc outputs a
// row, then Sinkhorn), and for every product in the CUDA trainer's parity test (the CPU trainer's
// arithmetic up to the sums' order). x, W and dy below are arrays of the precision `operands` names.
enum class Operands { Bf16, Fp32 };

// y [M, N] = x [M, K] · Wᵀ (overwritten). K = 0 gives zeros.
void linear_forward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t K, const void* W, int64_t N, float* y,
                    cudaStream_t stream = nullptr);

// dx [M, K] += dy W and dW [N, K] += dyᵀ x; either may be nullptr (not wanted). x, W: the forward's
// operands; dy: the output's gradient (its bf16 copy when Bf16).
void linear_backward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t K, const void* W, int64_t N,
                     const void* dy, float* dx, float* dW, cudaStream_t stream = nullptr);

// The grouped low-rank output (Attention's wo_a, grad::linear_grouped_*): x [M, G, Kg], group g
// through W's rows [g·Ng, (g+1)·Ng) (W [G·Ng, Kg]), y [M, G, Ng]: block-diagonal, one strided batch
// of G products (no gather of a group's columns).
void linear_grouped_forward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t G, int64_t Kg, const void* W,
                            int64_t Ng, float* y, cudaStream_t stream = nullptr);

// dx [M, G, Kg] += dy_g W_g and dW_g [Ng, Kg] += dy_gᵀ x_g per group; either may be nullptr.
void linear_grouped_backward(Blas& blas, Operands operands, const void* x, int64_t M, int64_t G, int64_t Kg, const void* W,
                             int64_t Ng, const void* dy, float* dx, float* dW, cudaStream_t stream = nullptr);

}  // namespace dsv41::train_cuda
