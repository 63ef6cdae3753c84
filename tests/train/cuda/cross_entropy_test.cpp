// train_cuda's cross-entropy against src/train/grad/cross_entropy.h in float: alone on logits the
// CPU op computes exactly, and composed with the head's bf16 product (linear.h).
//
// Alone: the CPU op's logits are h W ᵀ; with d = 1, h_r a power of two and W [vocab, 1] any fp32
// values, z_rv = h_r · W_v is exact, so the device op is fed those same logits. At V4.1's vocabulary
// (129280) and odd sizes, rows without a target (−1), and logits up to ±3000 (where exp without the
// maximum subtracted overflows). The loss: each row's Σ exp(z − m) over V terms in another order
// errs by ≈ 2⁻²⁴ √V / 3 relative (a walk; 7e-6 at V = 129280; expf's last bits add 2e-7), which is
// log s's error; m + log s may then round one unit of |m| the other way. Bound |ΔL| ≤ 1e-4 +
// 2⁻²² max|z| (the first 14× the walk's estimate). The gradient dz = (exp(z − m)/s − onehot)/n: p
// moves by the same ~1e-5 relative at most; bound NMSE 1e-9 (dz's norm is mostly its −1s); rows
// without a target exactly 0. The probabilities of rows picked out, against the softmax the CPU
// saved: each row's p share its sum's error, under (V·2⁻²⁴)² NMSE for any order of an fp32 sum of
// V positive terms (the H200's first run: 2.5e-9 at V = 50,000, where 1e-9 had been guessed).
//
// Composed (the head as the trainer runs it: h, W and dz cast to bf16 before their products): each
// logit errs by Δz with variance ≤ (2u²/3)·E[z²]-scale (the linear tests' argument, u = 2⁻⁸), and
// a row's loss by Σ_v p_v Δz_v − Δz_t: std ≤ 2·√(2/3)·u·rms(z). Bound |ΔL| ≤ 4u·rms(z) (≥ 2.4 of those
// stds for one row; the mean over rows is tighter). dz moves by p·(Δz − E_p Δz), ≈ 2.3u relative at
// rms(z) ≈ 2, and dh, dW add the casts of dz and of W or h: NMSE ≈ 6u²; bound 16u² = 2.4e-4.
//
// Two runs give the same bits, and a batch of sequences of uneven lengths gives each sequence the
// bits it gets alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include "train/cuda/cross_entropy.h"
#include "train/cuda/linear.h"
#include "train/grad/cross_entropy.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

// The CPU backward's dz (cross_entropy.h head_cross_entropy_backward's loop), from its saved
// probabilities.
std::vector<float> cpu_dz(const grad::CrossEntropySaved<float>& saved, int64_t rows, int64_t vocab,
                          const std::vector<int64_t>& targets) {
  std::vector<float> dz(size_t(rows * vocab), 0.0f);
  const float share = 1.0f / float(saved.counted);
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[size_t(r)] < 0) continue;
    for (int64_t v = 0; v < vocab; ++v) dz[size_t(r * vocab + v)] = share * saved.probs[size_t(r * vocab + v)];
    dz[size_t(r * vocab + targets[size_t(r)])] -= share;
  }
  return dz;
}

struct DeviceLoss {
  float loss, counted;
  std::vector<float> dz;
};

// The rows as one sequence.
DeviceLoss loss_on_device(const DeviceArray<float>& logits, int64_t rows, int64_t vocab, const DeviceArray<int64_t>& targets) {
  DeviceArray<float> row_max(static_cast<size_t>(rows)), row_sum(static_cast<size_t>(rows)), loss(2),
      dz(static_cast<size_t>(rows * vocab));
  const DeviceArray<int64_t> begin(test::row_begins({rows}));
  dz.poison();
  train_cuda::cross_entropy_forward(logits.get(), rows, vocab, targets.get(), begin.get(), 1, row_max.get(), row_sum.get(),
                                    loss.get());
  train_cuda::cross_entropy_backward(logits.get(), rows, vocab, targets.get(), begin.get(), 1, row_max.get(), row_sum.get(),
                                     loss.get(), 1.0f, dz.get());
  const std::vector<float> l = loss.download();
  return {l[0], l[1], dz.download()};
}

std::vector<int64_t> random_targets(int64_t rows, int64_t vocab, uint32_t seed, bool with_padding) {
  std::mt19937 rng(seed);
  std::vector<int64_t> t(static_cast<size_t>(rows));
  for (int64_t& v : t) v = int64_t(rng() % uint64_t(vocab));
  if (with_padding && rows > 1) t[1] = -1;
  return t;
}

TEST(TrainCudaCrossEntropy, MatchesTheCpuLossOnExactLogits) {
  DSV41_REQUIRE_DEVICE();
  struct Case {
    int64_t rows, vocab;
    bool padding;
  };
  const float scales[] = {1.0f, 2.0f, 0.5f, 64.0f, 4.0f, 0.25f, 8.0f};  // powers of two: h_r · W_v exact
  uint32_t seed = 1;
  for (const Case c : {Case{5, 129280, true}, Case{33, 1000, true}, Case{3, 7, false}, Case{1, 50000, false}}) {
    const std::vector<float> W = test::normal(size_t(c.vocab), 3.0, seed++);
    std::vector<float> h(size_t(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) h[size_t(r)] = scales[r % 7];
    const std::vector<int64_t> targets = random_targets(c.rows, c.vocab, seed++, c.padding);
    std::vector<float> logits(size_t(c.rows * c.vocab));
    float max_abs = 0;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t v = 0; v < c.vocab; ++v) {
        logits[size_t(r * c.vocab + v)] = h[size_t(r)] * W[size_t(v)];
        max_abs = std::max(max_abs, std::fabs(logits[size_t(r * c.vocab + v)]));
      }

    grad::CrossEntropySaved<float> saved;
    const float want = grad::head_cross_entropy_forward<float>(h.data(), c.rows, 1, W.data(), c.vocab, targets.data(), saved);
    const std::vector<float> want_dz = cpu_dz(saved, c.rows, c.vocab, targets);

    DeviceArray<float> dlogits(logits);
    DeviceArray<int64_t> dtargets(targets);
    const DeviceLoss got = loss_on_device(dlogits, c.rows, c.vocab, dtargets);
    const double bound = 1e-4 + 0x1p-22 * max_abs, e = test::nmse(got.dz, want_dz);
    std::printf("cross-entropy %ldx%ld (max |z| %.0f): loss %.7g vs CPU %.7g (bound %.2g), dz NMSE %.3g\n", long(c.rows),
                long(c.vocab), double(max_abs), double(got.loss), double(want), bound, e);
    EXPECT_NEAR(got.loss, want, bound);
    EXPECT_EQ(got.counted, float(saved.counted));
    EXPECT_LT(e, 1e-9);
    for (int64_t r = 0; r < c.rows; ++r)
      if (targets[size_t(r)] < 0) {
        for (int64_t v = 0; v < c.vocab; ++v) ASSERT_EQ(got.dz[size_t(r * c.vocab + v)], 0.0f) << "row without a target";
      }
    // The probabilities of rows picked out (backwards, the first twice): the CPU's saved softmax,
    // within dz's bound.
    std::vector<int64_t> picked;
    for (int64_t r = c.rows - 1; r >= 0; --r) picked.push_back(r);
    picked.push_back(0);
    DeviceArray<float> row_max(static_cast<size_t>(c.rows)), row_sum(static_cast<size_t>(c.rows)), loss(2),
        probs(picked.size() * size_t(c.vocab));
    const DeviceArray<int64_t> begin(test::row_begins({c.rows}));
    train_cuda::cross_entropy_forward(dlogits.get(), c.rows, c.vocab, dtargets.get(), begin.get(), 1, row_max.get(), row_sum.get(),
                                      loss.get());
    const DeviceArray<int64_t> dpicked(picked);
    train_cuda::cross_entropy_probabilities(dlogits.get(), c.vocab, row_max.get(), row_sum.get(), dpicked.get(), int64_t(picked.size()),
                                            probs.get());
    std::vector<float> want_p;
    for (int64_t r : picked)
      want_p.insert(want_p.end(), saved.probs.begin() + r * c.vocab, saved.probs.begin() + (r + 1) * c.vocab);
    // Every p of a row shares its s's error, which an fp32 sum of V positive terms in any order
    // keeps under (V − 1)·2⁻²⁴ relative (the CPU's is sequential): NMSE ≤ (V·2⁻²⁴)², plus expf's
    // and the division's last bits.
    const double e_p = test::nmse(probs.download(), want_p), p_bound = std::pow(double(c.vocab) * 0x1p-24, 2) + 1e-12;
    std::printf("  probabilities of %zu rows picked: NMSE %.3g (bound %.2g)\n", picked.size(), e_p, p_bound);
    EXPECT_LT(e_p, p_bound);

    const DeviceLoss again = loss_on_device(dlogits, c.rows, c.vocab, dtargets);
    EXPECT_TRUE(std::memcmp(&got.loss, &again.loss, sizeof(float)) == 0 && test::same_bits(got.dz, again.dz))
        << "two runs differ";
  }
}

TEST(TrainCudaCrossEntropy, HeadOnBf16ProductsWithinTheCastsBound) {
  DSV41_REQUIRE_DEVICE();
  train_cuda::Blas blas;
  const double u = test::kBf16Unit, grad_bound = 16 * u * u;
  struct Case {
    int64_t rows, d, vocab;
  };
  uint32_t seed = 100;
  for (const Case c : {Case{9, 512, 32000}, Case{4, 100, 1001}}) {
    const std::vector<float> h = test::normal(size_t(c.rows * c.d), 1.0, seed++);
    const std::vector<float> W = test::normal(size_t(c.vocab * c.d), 2.0 / std::sqrt(double(c.d)), seed++);
    const std::vector<int64_t> targets = random_targets(c.rows, c.vocab, seed++, true);

    grad::CrossEntropySaved<float> saved;
    const float want = grad::head_cross_entropy_forward<float>(h.data(), c.rows, c.d, W.data(), c.vocab, targets.data(), saved);
    std::vector<float> want_dh(h.size(), 0.0f), want_dW(W.size(), 0.0f), z(size_t(c.rows * c.vocab));
    grad::head_cross_entropy_backward<float>(h.data(), c.rows, c.d, W.data(), c.vocab, targets.data(), saved, 1.0f,
                                             want_dh.data(), want_dW.data());
    grad::linear_forward<float>(h.data(), c.rows, c.d, W.data(), c.vocab, z.data());
    double z2 = 0;
    for (const float v : z) z2 += double(v) * v;
    const double loss_bound = 4 * u * std::sqrt(z2 / double(z.size()));

    auto run = [&] {
      DeviceArray<float> h32(h), W32(W), logits(z.size()), dh(std::vector<float>(h.size(), 0.0f));
      DeviceArray<float> dW(std::vector<float>(W.size(), 0.0f));
      DeviceArray<uint16_t> hb(h.size()), Wb(W.size()), dzb(z.size());
      DeviceArray<int64_t> dtargets(targets);
      train_cuda::cast_bf16(h32.get(), int64_t(h.size()), hb.get());
      train_cuda::cast_bf16(W32.get(), int64_t(W.size()), Wb.get());
      train_cuda::linear_forward(blas, train_cuda::Operands::Bf16, hb.get(), c.rows, c.d, Wb.get(), c.vocab,
                                 logits.get());
      DeviceLoss l = loss_on_device(logits, c.rows, c.vocab, dtargets);
      DeviceArray<float> dz(l.dz);
      train_cuda::cast_bf16(dz.get(), int64_t(z.size()), dzb.get());
      train_cuda::linear_backward(blas, train_cuda::Operands::Bf16, hb.get(), c.rows, c.d, Wb.get(), c.vocab, dzb.get(),
                                  dh.get(), dW.get());
      return std::make_tuple(l.loss, dh.download(), dW.download());
    };
    const auto [loss, dh, dW] = run();
    const double edh = test::nmse(dh, want_dh), edw = test::nmse(dW, want_dW);
    std::printf("head + cross-entropy %ldx%ld→%ld: loss %.6g vs CPU %.6g (bound %.3g), NMSE dh %.3g dW %.3g (bound %.3g)\n",
                long(c.rows), long(c.d), long(c.vocab), double(loss), double(want), loss_bound, edh, edw, grad_bound);
    EXPECT_NEAR(loss, want, loss_bound);
    EXPECT_LT(edh, grad_bound);
    EXPECT_LT(edw, grad_bound);
    const auto [loss2, dh2, dW2] = run();
    EXPECT_TRUE(std::memcmp(&loss, &loss2, sizeof(float)) == 0 && test::same_bits(dh, dh2) && test::same_bits(dW, dW2))
        << "two runs differ";
  }
}

// One set of launches for a batch of sequences of uneven lengths (one empty, one past the total's
// 512 threads, rows without a target): each sequence's row maxima and sums, loss, count and dz the
// bits of the launches on that sequence alone.
TEST(TrainCudaCrossEntropy, BatchedAsEachSequenceAlone) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<int64_t> lengths = {5, 0, 17, 1, 600, 3};
  const std::vector<int64_t> begins = test::row_begins(lengths);
  const int64_t vocab = 3001, rows = begins.back(), sequences = int64_t(lengths.size());
  const float dloss = 0.7f;
  const std::vector<float> logits = test::normal(size_t(rows * vocab), 3.0, 7);
  std::vector<int64_t> targets = random_targets(rows, vocab, 8, false);
  for (int64_t r = 2; r < rows; r += 7) targets[size_t(r)] = -1;
  const DeviceArray<float> dlogits(logits);
  const DeviceArray<int64_t> dtargets(targets), begin(begins);

  DeviceArray<float> row_max(static_cast<size_t>(rows)), row_sum(static_cast<size_t>(rows)), loss(size_t(2 * sequences)),
      dz(logits.size());
  dz.poison();
  train_cuda::cross_entropy_forward(dlogits.get(), rows, vocab, dtargets.get(), begin.get(), sequences, row_max.get(),
                                    row_sum.get(), loss.get());
  train_cuda::cross_entropy_backward(dlogits.get(), rows, vocab, dtargets.get(), begin.get(), sequences, row_max.get(),
                                     row_sum.get(), loss.get(), dloss, dz.get());
  const std::vector<float> got_max = row_max.download(), got_sum = row_sum.download(), got_loss = loss.download(),
                           got_dz = dz.download();

  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t r = begins[size_t(s)], n = lengths[size_t(s)];
    DeviceArray<float> m(static_cast<size_t>(n)), sum(static_cast<size_t>(n)), l(2), g(size_t(n * vocab));
    const DeviceArray<int64_t> alone(test::row_begins({n}));
    l.poison();
    train_cuda::cross_entropy_forward(dlogits.get() + r * vocab, n, vocab, dtargets.get() + r, alone.get(), 1, m.get(), sum.get(),
                                      l.get());
    train_cuda::cross_entropy_backward(dlogits.get() + r * vocab, n, vocab, dtargets.get() + r, alone.get(), 1, m.get(), sum.get(),
                                       l.get(), dloss, g.get());
    auto slice = [](const std::vector<float>& v, int64_t first, int64_t count) {
      return std::vector<float>(v.begin() + first, v.begin() + first + count);
    };
    EXPECT_TRUE(test::same_bits(slice(got_max, r, n), m.download())) << "row maxima of sequence " << s;
    EXPECT_TRUE(test::same_bits(slice(got_sum, r, n), sum.download())) << "row sums of sequence " << s;
    EXPECT_TRUE(test::same_bits(slice(got_loss, 2 * s, 2), l.download())) << "loss and count of sequence " << s;
    EXPECT_TRUE(test::same_bits(slice(got_dz, r * vocab, n * vocab), g.download())) << "dz of sequence " << s;
  }
}

}  // namespace
}  // namespace dsv41
