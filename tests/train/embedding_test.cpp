// src/train/grad/embedding.h: the row gather's backward against central differences, with ids
// that repeat (a row gathered twice collects both gradients) and a row never gathered (none).
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "gradcheck.h"
#include "train/grad/embedding.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

TEST(GradEmbedding, TableGradientMatchesCentralDifferences) {
  const int64_t rows = 7, dim = 5;
  const std::vector<int64_t> ids = {3, 0, 3, 6, 1, 3};  // row 3 three times, rows 2, 4, 5 never
  const int64_t n = int64_t(ids.size());
  std::vector<double> table = normal_values(size_t(rows * dim), 1.0, 1);
  const std::vector<double> c = normal_values(size_t(n * dim), 1.0, 2);
  std::vector<double> y(size_t(n * dim));
  auto loss = [&] {
    grad::gather_rows_forward(table.data(), rows, dim, ids.data(), n, y.data());
    return weighted_sum(c, y);
  };
  std::vector<double> dtable(table.size(), 0.0);
  grad::gather_rows_backward(c.data(), dim, ids.data(), n, dtable.data());
  expect_gradient("dtable", table, dtable, loss);
  for (int64_t k = 0; k < dim; ++k) EXPECT_EQ(dtable[size_t(2 * dim + k)], 0.0) << "row 2 is never gathered";
}

TEST(GradEmbedding, RefusesAnIdOutsideTheTable) {
  const std::vector<double> table(6, 1.0);
  const std::vector<int64_t> ids = {0, 3};
  std::vector<double> y(4);
  EXPECT_THROW(grad::gather_rows_forward(table.data(), 3, 2, ids.data(), 2, y.data()), Error);
}

}  // namespace
}  // namespace dsv41
