#pragma once
// Row gathers from a table (model.py ParallelEmbedding, and the Engram table's lookup): the token
// embedding and the Engram n-gram rows. The backward adds each output row's gradient into the row
// it came from, so a row gathered twice gets both.
//
// As every op of src/train/grad (docs/training.md, "How the backward is organised"): templated on
// the scalar T, and the backward ADDS into the gradients it is given (zeroed by the caller).
#include <algorithm>
#include <cstdint>
#include <string>

#include "base/error.h"

namespace dsv41::grad {

// out[i] = table[ids[i]] for i < n; table [rows, dim], out [n, dim].
template <class T>
void gather_rows_forward(const T* table, int64_t rows, int64_t dim, const int64_t* ids, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= rows)
      fail("gather_rows", "ids in [0, " + std::to_string(rows) + ")", std::to_string(ids[i]));
    std::copy_n(table + ids[i] * dim, dim, out + i * dim);
  }
}

// dtable[ids[i]] += dout[i].
template <class T>
void gather_rows_backward(const T* dout, int64_t dim, const int64_t* ids, int64_t n, T* dtable) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < dim; ++k) dtable[ids[i] * dim + k] += dout[i * dim + k];
}

}  // namespace dsv41::grad
