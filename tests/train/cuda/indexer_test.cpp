// train_cuda's indexer scores (forward and backward), the attention target and the distillation
// loss against src/train/grad/indexer.h in float: 64 heads × 128 over 128 chosen entries of a
// 300-row key table (V4.1's indexer heads, a small table so that rows share keys), and odd shapes,
// with empty slots and a row with no target mass.
//
// Tolerances: the scores, dq, dw, dkeys and the target are formed with the CPU loop's operations in
// its order (sequential dot products, entries in order, rows then heads for dkeys): bit for bit; the
// relu's choices follow from equal dots. The loss and its gradient use expf and logf (CUDA's within
// 2 units of 2⁻²⁴, the C library's within 1): a row's loss moves by at most 2⁻²² (2 log k +
// max|s|) from them and by k·2⁻²⁴ of its Σ|terms| ≤ 10 + 2 max|s| from the sums' rounding, and the
// rows' total by rows·2⁻²⁴ |L|: bound Σ_rows 1e-5 (10 + 2 max|s|) + rows·2⁻²⁴ |L|. dscores: the
// softmax within a few 1e-7 relative, NMSE bound 1e-10 (it starts from non-zero values; the rows as
// one sequence with dloss = rows, so its factor dloss / rows is 1). Two runs: the same bits. And the
// loss batched over sequences of uneven lengths: each sequence's loss and gradient the bits of its
// rows alone, and the gradient the bits of dloss / n times the unweighted one (as the trainer once
// scaled each sequence's).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "train/cuda/elementwise.h"
#include "train/cuda/indexer.h"
#include "train/grad/indexer.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaIndexer, ScoresTargetAndLossMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, heads, d, n, k;
  };
  constexpr int64_t kWindow = 8;  // the attention's window slots before the compressed ones
  uint32_t seed = 1;
  for (const Case c : {Case{9, 64, 128, 300, 128}, Case{20, 4, 32, 40, 16}, Case{3, 1, 7, 5, 4}}) {
    std::mt19937 rng(seed++);
    std::vector<int64_t> idx(size_t(c.rows * c.k)), all(size_t(c.n));
    std::iota(all.begin(), all.end(), int64_t(0));
    for (int64_t r = 0; r < c.rows; ++r) {
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t j = 0; j < c.k; ++j) idx[size_t(r * c.k + j)] = rng() % 10 == 0 ? -1 : all[size_t(j)];
    }
    const size_t nq = size_t(c.rows * c.heads * c.d), nw = size_t(c.rows * c.heads), ns = size_t(c.rows * c.k);
    const std::vector<float> q = test::normal(nq, 1.0, seed++), keys = test::normal(size_t(c.n * c.d), 1.0, seed++);
    // weights_proj x · d^-½ H^-½: scores of order one.
    const std::vector<float> w = test::normal(nw, 1.0 / std::sqrt(double(c.d * c.heads)), seed++);
    const std::vector<float> dscores = test::normal(ns, 1.0, seed++);
    const std::vector<float> dq0 = test::normal(nq, 0.1, seed++), dw0 = test::normal(nw, 0.1, seed++);
    const std::vector<float> dkeys0 = test::normal(keys.size(), 0.1, seed++), dsc0 = test::normal(ns, 0.1, seed++);
    const int64_t entries = kWindow + c.k;
    std::vector<float> p = test::normal(size_t(c.rows * c.heads * entries), 1.0, seed++);
    for (float& v : p) v = std::fabs(v);
    for (int64_t h = 0; h < c.heads; ++h)  // row 0: no mass on its compressed slots
      for (int64_t j = 0; j < c.k; ++j) p[size_t(h * entries + kWindow + j)] = 0.0f;

    std::vector<float> scores(ns), dq = dq0, dw = dw0, dkeys = dkeys0, target(ns), dsc = dsc0;
    grad::indexer_scores_forward<float>(q.data(), w.data(), keys.data(), idx.data(), c.rows, c.heads, c.d, c.k, scores.data());
    grad::indexer_scores_backward<float>(q.data(), w.data(), keys.data(), idx.data(), c.rows, c.heads, c.d, c.k, dscores.data(),
                                         dq.data(), dw.data(), dkeys.data());
    grad::attention_target<float>(p.data(), c.rows, c.heads, entries, kWindow, c.k, target.data());
    const float loss = grad::index_distillation_loss<float>(scores.data(), target.data(), c.rows, c.k, dsc.data());
    double loss_bound = double(c.rows) * 0x1p-24 * std::fabs(loss);
    for (int64_t r = 0; r < c.rows; ++r) {
      float mx = 0;
      for (int64_t j = 0; j < c.k; ++j)
        if (std::isfinite(scores[size_t(r * c.k + j)])) mx = std::max(mx, std::fabs(scores[size_t(r * c.k + j)]));
      loss_bound += 1e-5 * (10.0 + 2.0 * mx);
    }

    DeviceArray<float> dq_in(q), dw_in(w), dkeys_in(keys), ddsc(dscores), dp(p);
    DeviceArray<int64_t> didx(idx);
    struct Got {
      std::vector<float> scores, dq, dw, dkeys, target, dsc;
      float loss;
    };
    auto run = [&] {
      DeviceArray<float> s(ns), gq(dq0), gw(dw0), gk(dkeys0), t(ns), gs(dsc0), l(1);
      const DeviceArray<int64_t> begin(test::row_begins({c.rows}));
      s.poison(), t.poison();
      train_cuda::indexer_scores_forward(dq_in.get(), dw_in.get(), dkeys_in.get(), didx.get(), c.rows, c.heads, c.d, c.k, s.get());
      train_cuda::indexer_scores_backward(dq_in.get(), dw_in.get(), dkeys_in.get(), c.n, didx.get(), c.rows, c.heads, c.d, c.k,
                                          ddsc.get(), gq.get(), gw.get(), gk.get());
      train_cuda::attention_target(dp.get(), c.rows, c.heads, entries, kWindow, c.k, t.get());
      train_cuda::index_distillation_loss(s.get(), t.get(), c.rows, c.k, begin.get(), 1, l.get());
      train_cuda::index_distillation_backward(s.get(), t.get(), c.rows, c.k, begin.get(), 1, float(c.rows), gs.get());
      return Got{s.download(), gq.download(), gw.download(), gk.download(), t.download(), gs.download(), l.download()[0]};
    };
    const Got got = run();
    const double edsc = test::nmse(got.dsc, dsc);
    std::printf("indexer %ld rows x %ld heads x %ld, k %ld of %ld: loss %.7g vs CPU %.7g (bound %.2g), dscores NMSE %.3g\n",
                long(c.rows), long(c.heads), long(c.d), long(c.k), long(c.n), double(got.loss), double(loss), loss_bound, edsc);
    EXPECT_TRUE(test::same_bits(got.scores, scores)) << "scores";
    EXPECT_TRUE(test::same_bits(got.dq, dq)) << "dq";
    EXPECT_TRUE(test::same_bits(got.dw, dw)) << "dw";
    EXPECT_TRUE(test::same_bits(got.dkeys, dkeys)) << "dkeys";
    EXPECT_TRUE(test::same_bits(got.target, target)) << "target";
    EXPECT_NEAR(got.loss, loss, loss_bound);
    EXPECT_LT(edsc, 1e-10);
    const Got again = run();
    EXPECT_TRUE(test::same_bits(got.dsc, again.dsc) && std::memcmp(&got.loss, &again.loss, sizeof(float)) == 0 &&
                test::same_bits(got.dkeys, again.dkeys))
        << "two runs differ";
  }
}

// One set of launches for a batch of sequences of uneven lengths (one empty, one past a block of
// 128 rows; empty slots, a row with no target mass): each sequence's loss and each row's gradient
// the bits of the launches on that sequence alone, and the gradient, into zeros, the bits of
// dloss / n (rounded once) times the unweighted gradient (add_scaled_into).
TEST(TrainCudaIndexer, DistillationLossBatchedAsEachSequenceAlone) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<int64_t> lengths = {3, 0, 40, 1, 150, 7};
  const std::vector<int64_t> begins = test::row_begins(lengths);
  const int64_t k = 16, rows = begins.back(), sequences = int64_t(lengths.size());
  const float dloss = 0.3f;
  std::vector<float> scores = test::normal(size_t(rows * k), 2.0, 21), target = test::normal(size_t(rows * k), 1.0, 22);
  std::mt19937 rng(23);
  for (int64_t r = 0; r < rows; ++r) {
    float mass = 0;
    for (int64_t j = 0; j < k; ++j) {
      float& p = target[size_t(r * k + j)];
      p = r == 5 || rng() % 5 == 0 ? 0.0f : std::fabs(p);
      if (rng() % 8 == 0) scores[size_t(r * k + j)] = -INFINITY;
      mass += p;
    }
    for (int64_t j = 0; j < k && mass > 0; ++j) target[size_t(r * k + j)] /= mass;
  }
  const DeviceArray<float> dscores_in(scores), dtarget(target);
  const DeviceArray<int64_t> begin(begins);

  DeviceArray<float> loss(static_cast<size_t>(sequences)), g(std::vector<float>(scores.size(), 0.0f));
  train_cuda::index_distillation_loss(dscores_in.get(), dtarget.get(), rows, k, begin.get(), sequences, loss.get());
  train_cuda::index_distillation_backward(dscores_in.get(), dtarget.get(), rows, k, begin.get(), sequences, dloss, g.get());
  const std::vector<float> got_loss = loss.download(), got_g = g.download();

  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t r = begins[size_t(s)], n = lengths[size_t(s)];
    const std::vector<float> none(size_t(n * k), 0.0f);
    DeviceArray<float> l(1), alone_g(none), unweighted(none), scaled(none);
    const DeviceArray<int64_t> alone(test::row_begins({n}));
    l.poison();
    const float *sc = dscores_in.get() + r * k, *tg = dtarget.get() + r * k;
    train_cuda::index_distillation_loss(sc, tg, n, k, alone.get(), 1, l.get());
    train_cuda::index_distillation_backward(sc, tg, n, k, alone.get(), 1, dloss, alone_g.get());
    train_cuda::index_distillation_backward(sc, tg, n, k, alone.get(), 1, float(n), unweighted.get());
    if (n > 0) train_cuda::add_scaled_into(unweighted.get(), n * k, dloss / float(n), scaled.get());
    const std::vector<float> want_g = alone_g.download();
    EXPECT_TRUE(test::same_bits({got_loss[size_t(s)]}, l.download())) << "loss of sequence " << s;
    EXPECT_TRUE(test::same_bits(std::vector<float>(got_g.begin() + r * k, got_g.begin() + (r + n) * k), want_g))
        << "dscores of sequence " << s;
    EXPECT_TRUE(test::same_bits(want_g, scaled.download())) << "dscores of sequence " << s << " against the scaled gradient";
  }
}

}  // namespace
}  // namespace dsv41
