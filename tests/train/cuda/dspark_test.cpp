// train_cuda's DSpark heads and loss against src/train/grad/dspark.h in float: the confidence head
// and the Markov head's addition (its product and gather are linear.h's and embedding.h's), the
// loss over a vocabulary of 32000 and an odd one of 7, a confidence logit of 30 (BCE kept finite).
//
// Tolerances:
//  * the confidence head and the Markov addition: the CPU's operations in its order: bit for bit.
//  * the loss, its labels computed by the device: p within a few units of 2⁻²⁴ relative (expf's
//    last bits, Σ exp in another order: relative error ≈ 2⁻²⁴ √V / 3): NMSE 1e-10; c* = 1 − ½‖p − q‖₁
//    within 1e-5 (a sum of V positive terms in another order, ≈ 4e-6 at V = 32000); the signs the
//    CPU's wherever |p − q| > 1e-5 max(p, q) (closer, either sign is right).
//  * the loss with the CPU's labels held (the backward's case): ce within Σρ 1e-4 (1 + max|z|) (log
//    of a sum off by ~4e-6 relative, one rounding of m + log s at |z|'s scale), tv within 1e-4 Σρ,
//    conf within 1e-5 Σκ (1 + |c|) (log1pf, expf last bits), accept exact (the same held c*, the
//    same double sums); dz and dc NMSE 1e-10 (p's last bits; they start from non-zero values).
// Two runs: the same bits. And the loss batched over sequences of uneven lengths: each sequence's
// p, labels, parts and gradients the bits of its rows alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "train/cuda/dspark.h"
#include "train/grad/dspark.h"
#include "train_device.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

TEST(TrainCudaDspark, HeadsMatchTheCpuBitForBit) {
  DSV41_REQUIRE_DEVICE();
  const int64_t rows = 37, d = 256, rank = 48, vocab = 1000;
  const std::vector<float> x = test::normal(size_t(rows * d), 1.0, 1), e = test::normal(size_t(rows * rank), 1.0, 2);
  const std::vector<float> w = test::normal(size_t(d + rank), 0.1, 3), dc = test::normal(size_t(rows), 1.0, 4);
  const std::vector<float> dx0 = test::normal(x.size(), 0.1, 5), de0 = test::normal(e.size(), 0.1, 6);
  const std::vector<float> dw0 = test::normal(w.size(), 0.1, 7);
  const std::vector<float> dz = test::normal(size_t(rows * vocab), 1.0, 8), du0 = test::normal(dz.size(), 0.1, 9);

  std::vector<float> c(static_cast<size_t>(rows)), dx = dx0, de = de0, dw = dw0, du = du0;
  grad::confidence_forward<float>(x.data(), e.data(), rows, d, rank, w.data(), c.data());
  grad::confidence_backward<float>(x.data(), e.data(), rows, d, rank, w.data(), dc.data(), dx.data(), de.data(), dw.data());
  grad::markov_backward<float>(e.data(), rows, vocab, nullptr, rank, dz.data(), du.data(), nullptr, nullptr);

  for (int run = 0; run < 2; ++run) {
    DeviceArray<float> dx_in(x), de_in(e), dw_in(w), ddc(dc), gc(static_cast<size_t>(rows)), gx(dx0), ge(de0), gw(dw0);
    DeviceArray<float> ddz(dz), gu(du0);
    gc.poison();
    train_cuda::confidence_forward(dx_in.get(), de_in.get(), rows, d, rank, dw_in.get(), gc.get());
    train_cuda::confidence_backward(dx_in.get(), de_in.get(), rows, d, rank, dw_in.get(), ddc.get(), gx.get(), ge.get(), gw.get());
    train_cuda::add_into(ddz.get(), int64_t(dz.size()), gu.get());
    EXPECT_TRUE(test::same_bits(gc.download(), c)) << "confidence c";
    EXPECT_TRUE(test::same_bits(gx.download(), dx)) << "confidence dx";
    EXPECT_TRUE(test::same_bits(ge.download(), de)) << "confidence de";
    EXPECT_TRUE(test::same_bits(gw.download(), dw)) << "confidence dw";
    EXPECT_TRUE(test::same_bits(gu.download(), du)) << "Markov du";
  }
}

// softmax of each row of normal logits: the target's distribution.
std::vector<float> random_distribution(int64_t rows, int64_t vocab, uint32_t seed) {
  std::vector<float> q = test::normal(size_t(rows * vocab), 2.0, seed);
  for (int64_t i = 0; i < rows; ++i) {
    float* r = q.data() + i * vocab;
    const float mx = *std::max_element(r, r + vocab);
    float sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += (r[v] = std::exp(r[v] - mx));
    for (int64_t v = 0; v < vocab; ++v) r[v] /= sum;
  }
  return q;
}

TEST(TrainCudaDspark, LossMatchesTheCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 100;
  for (const int64_t vocab : {int64_t(32000), int64_t(7)}) {
    const int64_t rows = 6;
    const std::vector<float> z = test::normal(size_t(rows * vocab), 2.0, seed++);
    const std::vector<float> q = random_distribution(rows, vocab, seed++);
    std::vector<float> c = test::normal(size_t(rows), 2.0, seed++);
    c[0] = 30.0f;
    std::vector<float> rho(static_cast<size_t>(rows));
    std::vector<int64_t> next(static_cast<size_t>(rows));
    std::mt19937 rng(seed++);
    for (int64_t i = 0; i < rows; ++i) rho[size_t(i)] = 0.1f + 0.9f * float(rng() % 1000) / 1000.0f, next[size_t(i)] = int64_t(rng() % uint64_t(vocab));
    const float kappa = 1.0f / float(rows);
    const std::vector<float> dz0 = test::normal(z.size(), 0.01, seed++), dc0 = test::normal(size_t(rows), 0.1, seed++);
    const grad::DSparkLossWeights a;

    grad::DSparkLabels labels;
    grad::DSparkLossSaved<float> saved;
    const grad::DSparkLossParts want = grad::dspark_loss_forward<float>(z.data(), q.data(), rows, vocab, next.data(), c.data(),
                                                                        rho.data(), kappa, labels, saved);
    std::vector<float> dz = dz0, dc = dc0;
    grad::dspark_loss_backward<float>(c.data(), rows, vocab, next.data(), rho.data(), kappa, labels, saved, a, 1.0f, dz.data(),
                                      dc.data());

    DeviceArray<float> dzin(z), dq(q), dcin(c), drho(rho), dkappa(std::vector<float>(size_t(rows), kappa));
    DeviceArray<int64_t> dnext(next), begin(test::row_begins({rows}));
    // The device's own labels.
    {
      DeviceArray<int8_t> signs(static_cast<size_t>(rows * vocab));
      DeviceArray<float> target(static_cast<size_t>(rows)), p(z.size());
      DeviceArray<double> parts(4);
      train_cuda::dspark_loss_forward(dzin.get(), dq.get(), rows, vocab, dnext.get(), dcin.get(), drho.get(), dkappa.get(),
                                      begin.get(), 1, {signs.get(), target.get(), false}, p.get(), parts.get());
      const std::vector<float> got_p = p.download(), got_target = target.download();
      const std::vector<int8_t> got_signs = signs.download();
      const double ep = test::nmse(got_p, saved.p);
      size_t flips = 0;
      for (size_t v = 0; v < got_signs.size(); ++v)
        if (got_signs[v] != labels.signs[v]) {
          ++flips;
          EXPECT_LE(std::fabs(saved.p[v] - q[v]), 1e-5f * std::max(saved.p[v], q[v])) << "a sign flipped far from p = q";
        }
      std::printf("dspark loss vocab %ld, own labels: p NMSE %.3g, %zu near-equal signs differ\n", long(vocab), ep, flips);
      EXPECT_LT(ep, 1e-10);
      for (int64_t i = 0; i < rows; ++i) EXPECT_NEAR(got_target[size_t(i)], labels.target[size_t(i)], 1e-5);
    }
    // The CPU's labels held.
    std::vector<int8_t> cpu_signs(labels.signs.begin(), labels.signs.end());
    std::vector<float> cpu_target(labels.target.begin(), labels.target.end());
    DeviceArray<int8_t> signs(cpu_signs);
    DeviceArray<float> target(cpu_target);
    auto run = [&](std::vector<double>& parts_out, std::vector<float>& dz_out, std::vector<float>& dc_out) {
      DeviceArray<float> p(z.size()), gz(dz0), gc(dc0);
      DeviceArray<double> parts(4);
      const train_cuda::DSparkLabels held{signs.get(), target.get(), true};
      train_cuda::dspark_loss_forward(dzin.get(), dq.get(), rows, vocab, dnext.get(), dcin.get(), drho.get(), dkappa.get(),
                                      begin.get(), 1, held, p.get(), parts.get());
      train_cuda::dspark_loss_backward(dcin.get(), rows, vocab, dnext.get(), drho.get(), dkappa.get(), held, p.get(), float(a.ce),
                                       float(a.tv), float(a.conf), 1.0f, gz.get(), gc.get());
      parts_out = parts.download(), dz_out = gz.download(), dc_out = gc.download();
    };
    std::vector<double> parts;
    std::vector<float> got_dz, got_dc;
    run(parts, got_dz, got_dc);
    double rho_sum = 0, conf_bound = 0;
    const float max_z = std::fabs(*std::max_element(z.begin(), z.end(), [](float l, float r) { return std::fabs(l) < std::fabs(r); }));
    for (int64_t i = 0; i < rows; ++i) rho_sum += rho[size_t(i)], conf_bound += 1e-5 * kappa * (1.0 + std::fabs(c[size_t(i)]));
    const double edz = test::nmse(got_dz, dz), edc = test::nmse(got_dc, dc);
    std::printf("dspark loss vocab %ld, held labels: ce %.7g/%.7g tv %.7g/%.7g conf %.7g/%.7g accept %.7g/%.7g; NMSE dz %.3g dc %.3g\n",
                long(vocab), parts[0], want.ce, parts[1], want.tv, parts[2], want.conf, parts[3], want.accept, edz, edc);
    EXPECT_NEAR(parts[0], want.ce, 1e-4 * rho_sum * (1.0 + max_z));
    EXPECT_NEAR(parts[1], want.tv, 1e-4 * rho_sum);
    EXPECT_NEAR(parts[2], want.conf, conf_bound);
    EXPECT_EQ(parts[3], want.accept);
    EXPECT_LT(edz, 1e-10);
    EXPECT_LT(edc, 1e-10);
    std::vector<double> parts2;
    std::vector<float> dz2, dc2;
    run(parts2, dz2, dc2);
    EXPECT_TRUE(parts == parts2 && test::same_bits(got_dz, dz2) && test::same_bits(got_dc, dc2)) << "two runs differ";
  }
}

// One set of launches for a batch of sequences of uneven lengths (one empty; each its own κ = 1 /
// its rows), the labels written by the forward: each sequence's p, signs, c*, parts and its rows'
// dz and dc (from non-zero values) the bits of the launches on that sequence alone.
TEST(TrainCudaDspark, LossBatchedAsEachSequenceAlone) {
  DSV41_REQUIRE_DEVICE();
  const std::vector<int64_t> lengths = {4, 0, 9, 1, 12};
  const std::vector<int64_t> begins = test::row_begins(lengths);
  const int64_t vocab = 1000, rows = begins.back(), sequences = int64_t(lengths.size());
  const grad::DSparkLossWeights a;
  const float dloss = 0.6f;
  const std::vector<float> z = test::normal(size_t(rows * vocab), 2.0, 31), q = random_distribution(rows, vocab, 32);
  const std::vector<float> c = test::normal(size_t(rows), 2.0, 33);
  const std::vector<float> dz0 = test::normal(z.size(), 0.01, 34), dc0 = test::normal(size_t(rows), 0.1, 35);
  std::vector<float> rho(static_cast<size_t>(rows)), kappa;
  std::vector<int64_t> next(static_cast<size_t>(rows));
  std::mt19937 rng(36);
  for (int64_t i = 0; i < rows; ++i) rho[size_t(i)] = 0.1f + 0.9f * float(rng() % 1000) / 1000.0f, next[size_t(i)] = int64_t(rng() % uint64_t(vocab));
  for (const int64_t n : lengths)
    for (int64_t i = 0; i < n; ++i) kappa.push_back(1.0f / float(n));
  const DeviceArray<float> dz_in(z), dq(q), dc_in(c), drho(rho), dkappa(kappa);
  const DeviceArray<int64_t> dnext(next);

  struct Loss {
    std::vector<float> p, target, dz, dc;
    std::vector<int8_t> signs;
    std::vector<double> parts;
  };
  // The loss of the rows first .. first + n − 1 as the sequences `begin` delimits.
  auto run = [&](int64_t first, int64_t n, const std::vector<int64_t>& begin) {
    const int64_t seqs = int64_t(begin.size()) - 1;
    DeviceArray<float> p(size_t(n * vocab)), target(static_cast<size_t>(n));
    DeviceArray<float> gz(std::vector<float>(dz0.begin() + first * vocab, dz0.begin() + (first + n) * vocab));
    DeviceArray<float> gc(std::vector<float>(dc0.begin() + first, dc0.begin() + first + n));
    DeviceArray<int8_t> signs(size_t(n * vocab));
    DeviceArray<double> parts(size_t(4 * seqs));
    const DeviceArray<int64_t> dbegin(begin);
    const train_cuda::DSparkLabels labels{signs.get(), target.get(), false};
    parts.poison();
    train_cuda::dspark_loss_forward(dz_in.get() + first * vocab, dq.get() + first * vocab, n, vocab, dnext.get() + first,
                                    dc_in.get() + first, drho.get() + first, dkappa.get() + first, dbegin.get(), seqs, labels,
                                    p.get(), parts.get());
    train_cuda::dspark_loss_backward(dc_in.get() + first, n, vocab, dnext.get() + first, drho.get() + first, dkappa.get() + first,
                                     labels, p.get(), float(a.ce), float(a.tv), float(a.conf), dloss,
                                     gz.get(), gc.get());
    return Loss{p.download(), target.download(), gz.download(), gc.download(), signs.download(), parts.download()};
  };
  const Loss batch = run(0, rows, begins);
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t r = begins[size_t(s)], n = lengths[size_t(s)];
    const Loss alone = run(r, n, test::row_begins({n}));
    auto rows_of = [&](const std::vector<float>& v, int64_t width) {
      return std::vector<float>(v.begin() + r * width, v.begin() + (r + n) * width);
    };
    EXPECT_TRUE(test::same_bits(rows_of(batch.p, vocab), alone.p)) << "p of sequence " << s;
    EXPECT_TRUE(std::equal(batch.signs.begin() + r * vocab, batch.signs.begin() + (r + n) * vocab, alone.signs.begin()))
        << "signs of sequence " << s;
    EXPECT_TRUE(test::same_bits(rows_of(batch.target, 1), alone.target)) << "c* of sequence " << s;
    EXPECT_EQ(std::memcmp(batch.parts.data() + 4 * s, alone.parts.data(), 4 * sizeof(double)), 0) << "parts of sequence " << s;
    EXPECT_TRUE(test::same_bits(rows_of(batch.dz, vocab), alone.dz)) << "dz of sequence " << s;
    EXPECT_TRUE(test::same_bits(rows_of(batch.dc, 1), alone.dc)) << "dc of sequence " << s;
  }
}

}  // namespace
}  // namespace dsv41
