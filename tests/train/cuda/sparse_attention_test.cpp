// train_cuda's sparse attention with a sink, forward and backward, against
// src/train/grad/sparse_attention.h in float: 64 heads × 512 over a window of 128 and 64 chosen
// entries (V4.1's attention on a small KV table, so that every entry is listed by several rows and
// the scatter into dkv has work), and odd shapes, with empty slots (−1) and a row with none listed.
//
// Tolerance: the kernels compute the scores, dp, the normalizer, D, o, dq and each dkv and dsink
// value with the CPU loop's operations in its order (sequential dots, entry order, rows then
// heads), so they differ only where expf's last bits do (CUDA's within 2 units of 2⁻²⁴ of the
// exact value, the C library's within 1): each probability within a few units of 2⁻²⁴ relative,
// and every output, a sum of terms each off by that relative, within ~10 units (NMSE ≤ 4e-13).
// Bound NMSE 1e-10 on o, p, the sink's probability, dq, dkv, dsink; a wrong term is ≥ 1e-6. The
// gradients start from non-zero values (the backward adds). Two runs give the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "train/cuda/sparse_attention.h"
#include "train/grad/sparse_attention.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct AttentionResults {
  std::vector<float> o, p, sink_p, dq, dkv, dsink;
};

TEST(TrainCudaSparseAttention, MatchesTheCpuForwardAndBackward) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, heads, d, n, entries;
  };
  uint32_t seed = 1;
  for (const Case c : {Case{9, 64, 512, 300, 192}, Case{20, 8, 64, 40, 24}, Case{3, 1, 7, 5, 4}}) {
    std::mt19937 rng(seed++);
    // Each row lists distinct entries of kv, about one slot in ten empty; the last row none.
    std::vector<int64_t> idx(size_t(c.rows * c.entries));
    std::vector<int64_t> all(size_t(c.n));
    std::iota(all.begin(), all.end(), int64_t(0));
    for (int64_t r = 0; r < c.rows; ++r) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < c.entries; ++j)
        idx[size_t(r * c.entries + j)] = r == c.rows - 1 || rng() % 10 == 0 ? -1 : all[size_t(j % c.n)];
    }
    const size_t nq = size_t(c.rows * c.heads * c.d);
    const std::vector<float> q = test::normal(nq, 1.0, seed++), kv = test::normal(size_t(c.n * c.d), 1.0, seed++);
    const std::vector<float> sink = test::normal(size_t(c.heads), 1.0, seed++), dout = test::normal(nq, 1.0, seed++);
    const std::vector<float> dq0 = test::normal(nq, 0.1, seed++), dkv0 = test::normal(kv.size(), 0.1, seed++);
    const std::vector<float> dsink0 = test::normal(sink.size(), 0.1, seed++);
    const float scale = float(1.0 / std::sqrt(double(c.d)));

    AttentionResults want{std::vector<float>(nq), {}, {}, dq0, dkv0, dsink0};
    grad::SparseAttentionSaved<float> saved;
    grad::sparse_attention_forward<float>(q.data(), c.rows, c.heads, c.d, kv.data(), idx.data(), c.entries, sink.data(), scale,
                                          want.o.data(), saved);
    want.p = saved.p, want.sink_p = saved.sink;
    grad::sparse_attention_backward<float>(q.data(), c.rows, c.heads, c.d, kv.data(), idx.data(), c.entries, scale, saved,
                                           dout.data(), want.dq.data(), want.dkv.data(), want.dsink.data());

    DeviceArray<float> dq_in(q), dkv_in(kv), dsink_in(sink), ddout(dout);
    DeviceArray<int64_t> didx(idx);
    auto run = [&] {
      const size_t np = size_t(c.rows * c.heads * c.entries), ns = size_t(c.rows * c.heads);
      DeviceArray<float> o(nq), p(np), sink_p(ns), dq(dq0), dkv(dkv0), dsink(dsink0);
      o.poison(), p.poison(), sink_p.poison();
      train_cuda::sparse_attention_forward(dq_in.get(), c.rows, c.heads, c.d, dkv_in.get(), didx.get(), c.entries,
                                           dsink_in.get(), scale, o.get(), p.get(), sink_p.get());
      train_cuda::sparse_attention_backward(dq_in.get(), c.rows, c.heads, c.d, dkv_in.get(), c.n, didx.get(), c.entries, scale,
                                            p.get(), sink_p.get(), ddout.get(), dq.get(), dkv.get(), dsink.get());
      return AttentionResults{o.download(), p.download(), sink_p.download(), dq.download(), dkv.download(), dsink.download()};
    };
    const AttentionResults got = run();
    const double e[6] = {test::nmse(got.o, want.o),   test::nmse(got.p, want.p),     test::nmse(got.sink_p, want.sink_p),
                         test::nmse(got.dq, want.dq), test::nmse(got.dkv, want.dkv), test::nmse(got.dsink, want.dsink)};
    std::printf("sparse attention %ld rows x %ld heads x %ld, %ld entries of %ld: NMSE o %.3g p %.3g sink %.3g dq %.3g dkv %.3g "
                "dsink %.3g\n",
                long(c.rows), long(c.heads), long(c.d), long(c.entries), long(c.n), e[0], e[1], e[2], e[3], e[4], e[5]);
    for (const double v : e) EXPECT_LT(v, 1e-10) << c.rows << "x" << c.heads << "x" << c.d;

    const AttentionResults again = run();
    EXPECT_TRUE(test::same_bits(got.o, again.o) && test::same_bits(got.p, again.p) &&
                test::same_bits(got.sink_p, again.sink_p) && test::same_bits(got.dq, again.dq) &&
                test::same_bits(got.dkv, again.dkv) && test::same_bits(got.dsink, again.dsink))
        << "two runs differ";
  }
}

}  // namespace
}  // namespace dsv41
