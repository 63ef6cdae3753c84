// The hybrid Newton–Schulz iteration on the device (newton_schulz.h).
//
// ‖U‖_F of each block in two deterministic passes: fixed chunks of the block summed in double by a
// fixed tree, then the chunks' partials added in chunk order by one thread per block. The products
// are three strided-batched cuBLASLt calls per iteration over all blocks; X and its next iterate
// ping-pong between the caller's array and a scratch copy. In bf16, each product's operands are
// first cast (train_cuda::cast_bf16, round to nearest even) into bf16 scratch: X, A and B once
// per iteration each. Flops per iteration and block (s the
// smaller side, l the larger): 2 s² l (A) + 2 s³ (B) + 2 s² l (X').
//
// The products are written row-major, as the CPU's; Blas's are column-major, and a row-major
// [r, c] array is a column-major [c, r] one, so D = α op(A) op(B) + β C row-major is
// Dᵀ = α op(B)ᵀ op(A)ᵀ + β Cᵀ column-major: B first, m and n swapped (row_major below).
#include "train/cuda/optim/newton_schulz.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "train/cuda/linear.h"
#include "train/cuda/reduce.cuh"
#include "train/optim/newton_schulz.h"

namespace dsv41::train_cuda::optim {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kChunk = int64_t(kThreads) * 64;  // elements of a block summed by one CUDA block

// partial[block · chunks + chunk] = Σ x² over the chunk, in double.
__global__ void sum_squares_kernel(const float* x, int64_t per_block, int64_t chunks, double* partial) {
  __shared__ double scratch[kThreads / 32];
  const int64_t block = blockIdx.y, chunk = blockIdx.x;
  const float* base = x + block * per_block;
  const int64_t end = min(per_block, (chunk + 1) * kChunk);
  double s = 0;
  for (int64_t i = chunk * kChunk + threadIdx.x; i < end; i += kThreads) s += double(base[i]) * double(base[i]);
  s = block_sum<kThreads>(s, scratch);
  if (threadIdx.x == 0) partial[block * chunks + chunk] = s;
}

// inv[block] = 1 / (‖U_block‖_F + ε) rounded to float, as src/train/optim/newton_schulz.cpp.
__global__ void inverse_norm_kernel(const double* partial, int64_t blocks, int64_t chunks, float* inv) {
  const int64_t block = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (block >= blocks) return;
  double s = 0;
  for (int64_t c = 0; c < chunks; ++c) s += partial[block * chunks + c];
  inv[block] = float(1.0 / (sqrt(s) + dsv41::optim::kNewtonSchulzEps));
}

__global__ void scale_kernel(float* x, int64_t n, int64_t per_block, const float* inv) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * inv[i / per_block];
}

// Blas's product for a dense row-major one: p with op(A) [m, k], op(B) [k, n], C and D [m, n] all
// row-major and contiguous, its leading dimensions unset.
Blas::Product row_major(Blas::Product p) {
  std::swap(p.a, p.b);
  std::swap(p.stride_a, p.stride_b);
  std::swap(p.transpose_a, p.transpose_b);
  std::swap(p.m, p.n);
  // Each leading dimension is its dense column-major matrix's row count: A stored [m, k] (or [k, m]
  // when transposed), B [k, n] (or [n, k]), C and D [m, n].
  p.lda = p.transpose_a ? p.k : p.m;
  p.ldb = p.transpose_b ? p.n : p.k;
  p.ldc = p.ldd = p.m;
  return p;
}

}  // namespace

void orthogonalize(Blas& blas, float* X, int64_t blocks, int64_t rows, int64_t cols, NsPrecision precision,
                   cudaStream_t stream) {
  const char* where = "train_cuda::optim::orthogonalize";
  if (blocks < 1 || rows < 1 || cols < 1)
    fail(where, "at least one block of at least 1 × 1",
         std::to_string(blocks) + " of " + std::to_string(rows) + " × " + std::to_string(cols));
  if (blocks > 65535) fail(where, "at most 65535 blocks (a grid's second dimension)", std::to_string(blocks));
  const int64_t per_block = rows * cols, n = blocks * per_block;
  const bool tall = rows > cols, use_bf16 = precision == NsPrecision::Bf16;
  const int64_t s = tall ? cols : rows, gram = s * s;  // the Gram matrices' side and size

  const int64_t chunks = (per_block + kChunk - 1) / kChunk;
  cuda::DeviceBuffer<double> partial(blocks * chunks, stream, true);
  cuda::DeviceBuffer<float> inv(blocks, stream, true), other(n, stream, true), A(blocks * gram, stream, true),
      B(blocks * gram, stream, true);
  sum_squares_kernel<<<dim3(unsigned(chunks), unsigned(blocks)), kThreads, 0, stream>>>(X, per_block, chunks, partial.get());
  cuda::check_launch(where);
  inverse_norm_kernel<<<unsigned((blocks + 127) / 128), 128, 0, stream>>>(partial.get(), blocks, chunks, inv.get());
  cuda::check_launch(where);
  scale_kernel<<<unsigned((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(X, n, per_block, inv.get());
  cuda::check_launch(where);

  // The products' operands: the fp32 arrays themselves, or their bf16 copies.
  cuda::DeviceBuffer<bf16> x16(use_bf16 ? n : 0, stream, true), a16(use_bf16 ? blocks * gram : 0, stream, true),
      b16(use_bf16 ? blocks * gram : 0, stream, true);
  auto operand = [&](const float* x, int64_t count, cuda::DeviceBuffer<bf16>& copy) -> const void* {
    if (!use_bf16) return x;
    cast_bf16(x, count, copy.get(), stream);
    return copy.get();
  };

  float *cur = X, *next = other.get();
  for (const dsv41::optim::NewtonSchulzStage& st : dsv41::optim::kHybridNewtonSchulz)
    for (int it = 0; it < st.iterations; ++it) {
      const void* x = operand(cur, n, x16);
      if (tall)  // A = Zᵀ Z
        blas.matmul(row_major({.bf16 = use_bf16, .transpose_a = true, .m = s, .n = s, .k = rows,
                               .a = x, .stride_a = per_block, .b = x, .stride_b = per_block,
                               .d = A.get(), .stride_d = gram, .batch = blocks}),
                    stream);
      else  // A = X Xᵀ
        blas.matmul(row_major({.bf16 = use_bf16, .transpose_b = true, .m = s, .n = s, .k = cols,
                               .a = x, .stride_a = per_block, .b = x, .stride_b = per_block,
                               .d = A.get(), .stride_d = gram, .batch = blocks}),
                    stream);
      const void* a = operand(A.get(), blocks * gram, a16);
      // B = c · A Aᵀ + b · A
      blas.matmul(row_major({.bf16 = use_bf16, .transpose_b = true, .m = s, .n = s, .k = s,
                             .a = a, .stride_a = gram, .b = a, .stride_b = gram,
                             .alpha = st.c, .beta = st.b, .c = A.get(), .stride_c = gram,
                             .d = B.get(), .stride_d = gram, .batch = blocks}),
                  stream);
      const void* b = operand(B.get(), blocks * gram, b16);
      if (tall)  // Z' = Z Bᵀ + a · Z
        blas.matmul(row_major({.bf16 = use_bf16, .transpose_b = true, .m = rows, .n = cols, .k = cols,
                               .a = x, .stride_a = per_block, .b = b, .stride_b = gram,
                               .alpha = 1.0f, .beta = st.a, .c = cur, .stride_c = per_block,
                               .d = next, .stride_d = per_block, .batch = blocks}),
                    stream);
      else  // X' = B X + a · X
        blas.matmul(row_major({.bf16 = use_bf16, .m = rows, .n = cols, .k = rows,
                               .a = b, .stride_a = gram, .b = x, .stride_b = per_block,
                               .alpha = 1.0f, .beta = st.a, .c = cur, .stride_c = per_block,
                               .d = next, .stride_d = per_block, .batch = blocks}),
                    stream);
      std::swap(cur, next);
    }
  if (cur != X)
    cuda::check(cudaMemcpyAsync(X, cur, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream), where);
}

}  // namespace dsv41::train_cuda::optim
