// train_cuda's row gather and scatter-add against src/train/grad/embedding.h in float: the token
// embedding at V4.1's vocabulary (129280 rows) and rows of 4096, and odd shapes, with ids repeated
// many times (the scatter's hard case: a row gathered more than once gets every contribution).
//
// Tolerance: none. The gather copies; the scatter adds each row's gradients into it in increasing
// position, the CPU's order, with one rounding per addition as the CPU's loop: bit for bit. Ids
// outside [0, rows) give NaN rows forward and add nothing backward. Two runs: the same bits. The
// scatter of distinct ids without a sort: the sorted scatter's bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "train/cuda/embedding.h"
#include "train/grad/embedding.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaEmbedding, GatherAndScatterAddAreTheCpusBits) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, dim, n, distinct;  // ids drawn from the first `distinct` rows, and a few from all
  };
  uint32_t seed = 1;
  for (const Case c : {Case{129280, 256, 512, 40}, Case{1000, 4096, 300, 50}, Case{50, 7, 1000, 50}, Case{3, 1, 5, 2}}) {
    std::mt19937 rng(seed++);
    std::vector<int64_t> ids(size_t(c.n));
    for (int64_t& id : ids) id = int64_t(rng() % 8 == 0 ? rng() % uint64_t(c.rows) : rng() % uint64_t(c.distinct));
    const std::vector<float> table = test::normal(size_t(c.rows * c.dim), 1.0, seed++);
    const std::vector<float> dout = test::normal(size_t(c.n * c.dim), 1.0, seed++);
    const std::vector<float> dtable0 = test::normal(table.size(), 1.0, seed++);

    std::vector<float> out(dout.size()), dtable = dtable0;
    grad::gather_rows_forward<float>(table.data(), c.rows, c.dim, ids.data(), c.n, out.data());
    grad::gather_rows_backward<float>(dout.data(), c.dim, ids.data(), c.n, dtable.data());

    DeviceArray<float> dtab(table), ddout(dout), dout_rows(dout.size());
    DeviceArray<int64_t> dids(ids);
    dout_rows.poison();
    train_cuda::gather_rows_forward(dtab.get(), c.rows, c.dim, dids.get(), c.n, dout_rows.get());
    EXPECT_TRUE(test::same_bits(dout_rows.download(), out)) << "gather, " << c.rows << "x" << c.dim;
    for (int run = 0; run < 2; ++run) {
      DeviceArray<float> grad(dtable0);
      train_cuda::gather_rows_backward(ddout.get(), c.dim, dids.get(), c.n, c.rows, grad.get());
      const std::vector<float> got = grad.download();
      size_t differ = 0;
      for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &dtable[i], sizeof(float)) != 0;
      std::printf("scatter-add %ld ids into %ldx%ld, run %d: %zu of %zu values differ\n", long(c.n), long(c.rows), long(c.dim),
                  run, differ, got.size());
      EXPECT_EQ(differ, 0u) << "scatter-add, " << c.rows << "x" << c.dim;
    }
  }
}

// Distinct ids (an expert's rows: increasing, with gaps; and a shuffled subset with ids outside
// the table): the scatter without a sort gives the sorted scatter's bits, and the CPU's.
TEST(TrainCudaEmbedding, DistinctIdsScatterAsTheSortedScatter) {
  DSV41_REQUIRE_DEVICE();
  const int64_t rows = 4096, dim = 384;
  std::mt19937 rng(21);
  std::vector<int64_t> increasing, shuffled(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    if (rng() % 3 == 0) increasing.push_back(r);
  std::iota(shuffled.begin(), shuffled.end(), 0);
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  shuffled.resize(1000);
  shuffled[10] = -1;
  shuffled[500] = rows;
  uint32_t seed = 30;
  for (const std::vector<int64_t>& ids : {increasing, shuffled}) {
    const int64_t n = int64_t(ids.size());
    const std::vector<float> dout = test::normal(size_t(n * dim), 1.0, seed++);
    const std::vector<float> dtable0 = test::normal(size_t(rows * dim), 1.0, seed++);
    std::vector<float> want = dtable0;
    for (int64_t i = 0; i < n; ++i)
      if (ids[size_t(i)] >= 0 && ids[size_t(i)] < rows)
        grad::gather_rows_backward<float>(dout.data() + i * dim, dim, &ids[size_t(i)], 1, want.data());
    DeviceArray<float> ddout(dout), sorted(dtable0), distinct(dtable0);
    DeviceArray<int64_t> dids(ids);
    train_cuda::gather_rows_backward(ddout.get(), dim, dids.get(), n, rows, sorted.get());
    train_cuda::gather_rows_backward_distinct(ddout.get(), dim, dids.get(), n, rows, distinct.get());
    const std::vector<float> got = distinct.download();
    EXPECT_TRUE(test::same_bits(got, sorted.download())) << n << " ids";
    EXPECT_TRUE(test::same_bits(got, want)) << n << " ids";
  }
}

TEST(TrainCudaEmbedding, IdsOutsideTheTableGiveNanRowsAndNoGradient) {
  DSV41_REQUIRE_DEVICE();
  const int64_t rows = 20, dim = 33;
  const std::vector<int64_t> ids = {3, -1, 7, 20, 3, 19, 1000, 0};
  std::vector<int64_t> valid_ids;
  std::vector<float> valid_dout;
  const std::vector<float> table = test::normal(size_t(rows * dim), 1.0, 7);
  const std::vector<float> dout = test::normal(ids.size() * size_t(dim), 1.0, 8);
  const std::vector<float> dtable0 = test::normal(table.size(), 1.0, 9);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= 0 && ids[i] < rows) {
      valid_ids.push_back(ids[i]);
      valid_dout.insert(valid_dout.end(), dout.begin() + int64_t(i) * dim, dout.begin() + int64_t(i + 1) * dim);
    }
  std::vector<float> want = dtable0;
  grad::gather_rows_backward<float>(valid_dout.data(), dim, valid_ids.data(), int64_t(valid_ids.size()), want.data());

  DeviceArray<float> dtab(table), ddout(dout), out(dout.size()), grad(dtable0);
  DeviceArray<int64_t> dids(ids);
  train_cuda::gather_rows_forward(dtab.get(), rows, dim, dids.get(), int64_t(ids.size()), out.get());
  const std::vector<float> got = out.download();
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t k = 0; k < dim; ++k) {
      const float v = got[i * size_t(dim) + size_t(k)];
      if (ids[i] >= 0 && ids[i] < rows)
        ASSERT_EQ(v, table[size_t(ids[i] * dim + k)]) << "id " << ids[i];
      else
        ASSERT_TRUE(std::isnan(v)) << "id " << ids[i] << " outside the table gave " << v;
    }
  train_cuda::gather_rows_backward(ddout.get(), dim, dids.get(), int64_t(ids.size()), rows, grad.get());
  EXPECT_TRUE(test::same_bits(grad.download(), want));
}

}  // namespace
}  // namespace dsv41
