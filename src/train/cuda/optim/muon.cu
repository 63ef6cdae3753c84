// Muon on the device (muon.h): the momentum kernel writes Ĝ into a scratch array, Newton–Schulz
// turns it into O in place, and one kernel applies the decay and the scaled update (12 bytes of
// traffic per element).
#include "train/cuda/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cuda/check.h"
#include "backend/cuda/device_buffer.h"
#include "base/error.h"
#include "train/cuda/optim/nesterov.h"
#include "train/cuda/optim/newton_schulz.h"

namespace dsv41::train_cuda::optim {

namespace {

__global__ void apply_kernel(float* W, const float* update, int64_t n, float decay, float lr, float scale) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) W[i] = W[i] * decay - lr * (update[i] * scale);
}

}  // namespace

void muon_step(Blas& blas, float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, int64_t row_blocks,
               float lr, const dsv41::optim::MuonOptions& options, NsPrecision precision, cudaStream_t stream) {
  const char* where = "train_cuda::optim::muon_step";
  if (rows < 1 || cols < 1) fail(where, "a matrix of at least 1 × 1", std::to_string(rows) + " × " + std::to_string(cols));
  if (row_blocks < 1 || rows % row_blocks != 0)
    fail(where, "a number of row blocks dividing " + std::to_string(rows), std::to_string(row_blocks));
  const int64_t n = rows * cols, block_rows = rows / row_blocks;
  cuda::DeviceBuffer<float> update(n, stream, true);
  nesterov_momentum(grad, momentum, n, options.momentum, update.get(), stream);
  orthogonalize(blas, update.get(), row_blocks, block_rows, cols, precision, stream);
  muon_apply(W, update.get(), n, block_rows, cols, lr, options, stream);
}

void muon_apply(float* W, const float* O, int64_t n, int64_t block_rows, int64_t cols, float lr,
                const dsv41::optim::MuonOptions& options, cudaStream_t stream) {
  // The CPU's scalars (src/train/optim/muon.cpp), computed the same way.
  const float scale = float(std::sqrt(double(std::max(block_rows, cols)))) * options.update_rms;
  const float decay = 1 - lr * options.weight_decay;
  apply_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(W, O, n, decay, lr, scale);
  cuda::check_launch("train_cuda::optim::muon_apply");
}

}  // namespace dsv41::train_cuda::optim
