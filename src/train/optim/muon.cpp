#include "train/optim/muon.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "train/optim/nesterov.h"
#include "train/optim/newton_schulz.h"

namespace dsv41::optim {

void muon_step(float* W, const float* grad, float* momentum, int64_t rows, int64_t cols, int64_t row_blocks, float lr,
               const MuonOptions& options) {
  if (rows < 1 || cols < 1)
    fail("muon_step", "a matrix of at least 1 × 1", std::to_string(rows) + " × " + std::to_string(cols));
  if (row_blocks < 1 || rows % row_blocks != 0)
    fail("muon_step", "a number of row blocks dividing " + std::to_string(rows), std::to_string(row_blocks));
  const int64_t n = rows * cols, block_rows = rows / row_blocks, block = block_rows * cols;
  std::vector<float> lookahead(static_cast<size_t>(n)), update(static_cast<size_t>(n));
  nesterov_momentum(grad, momentum, n, options.momentum, lookahead.data());
  for (int64_t h = 0; h < row_blocks; ++h)
    orthogonalize(lookahead.data() + h * block, block_rows, cols, update.data() + h * block);
  const float scale = float(std::sqrt(double(std::max(block_rows, cols)))) * options.update_rms;
  const float decay = 1 - lr * options.weight_decay;
  for (int64_t i = 0; i < n; ++i) W[i] = W[i] * decay - lr * (update[size_t(i)] * scale);
}

}  // namespace dsv41::optim
