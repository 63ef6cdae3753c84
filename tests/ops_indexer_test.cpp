// Unit tests of src/backend/cpu/indexer.h (index scores, top-k, candidate blocks) and
// compressor.h (softmax pooling of a group), against naive versions and hand-built cases.
//
// Reference: model.py Indexer.forward (index_score = Σ_h relu(q_h · k_t) · w_h over bf16 tensors,
// then topk and a sort into position order), select_candidate_blocks (block max with -inf padding,
// the newest block pinned to +inf, topk over blocks, -inf picks dropped) and Compressor.forward
// (kv · softmax(score) over the group, summed, in fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cpu/compressor.h"
#include "backend/cpu/indexer.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::kF32Unit;

const float kInf = std::numeric_limits<float>::infinity();

// ---- index_scores ----

// The reference's roundings, each explicit: the bf16 einsum rounds every q_h · k_t, relu, the bf16
// product with w_h rounds again, and the bf16 sum over heads (fp32 accumulation) rounds once.
std::vector<float> naive_index_scores(const std::vector<float>& q, const std::vector<float>& w, int heads, int hd,
                                      const std::vector<float>& keys, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    double sum = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int c = 0; c < hd; ++c) dot += double(q[size_t(h) * hd + c]) * keys[size_t(t) * hd + c];
      const double term = std::max(double(round_bf16(float(dot))), 0.0) * w[h];
      sum += round_bf16(float(term));
    }
    out[size_t(t)] = round_bf16(float(sum));
  }
  return out;
}

// Exact equality by design: q and k are multiples of 2^-4 with |·| <= 0.75, so every dot product
// over 128 channels is a multiple of 2^-8 below 72 (15 bits: exact in fp32 in any order, and in
// double); bf16 rounding keeps multiples of 2^-8; the weights are multiples of 2^-4 in [-2, 2], so
// each term is a multiple of 2^-12 below 144 (exact), rounded to bf16 (same in both), and the sum of
// 16 terms is a multiple of 2^-12 below 2304 (24 bits: exact in fp32 in any order). Every rounding
// the op makes is then one the naive version makes identically. n = 300 takes the parallel path.
TEST(OpsIndexScores, EqualTheReferenceRoundingsExactly) {
  const int heads = 16, hd = 128;
  const int64_t n = 300;
  const std::vector<float> q = test::e2m1_eighths(size_t(heads) * hd, 1);
  const std::vector<float> keys = test::e2m1_eighths(size_t(n) * hd, 2);
  std::vector<float> w(heads);
  std::mt19937 rng(3);
  for (float& v : w) v = float(int(rng() % 65) - 32) / 16.0f;
  std::vector<float> scores(static_cast<size_t>(n));
  index_scores(q.data(), w.data(), heads, hd, keys.data(), n, scores.data());
  const std::vector<float> expected = naive_index_scores(q, w, heads, hd, keys, n);
  EXPECT_EQ(scores, expected);
  // the test means something only if the roundings and the relu act: some dots must need rounding
  // (more than 8 significant bits) and some must be negative
  int rounded = 0, negative = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int c = 0; c < hd; ++c) dot += double(q[size_t(h) * hd + c]) * keys[size_t(t) * hd + c];
      rounded += double(round_bf16(float(dot))) != dot;
      negative += dot < 0;
    }
  EXPECT_GT(rounded, 100);
  EXPECT_GT(negative, 100);
}

// Hand case, hd = 2, key k = (1, 1):
//   head 0: q = (256, 1), dot 257, bf16 -> 256 (a tie, to even), w = 1:  256
//   head 1: q = (255, 0), dot 255 (exact),                   w = -1: -255
//   head 2: q = (-3, 0),  dot -3, relu -> 0,                 w = -1:  0 (not +3)
// I = bf16(256 - 255 + 0) = 1; without the rounding of the dot it would be 2, without the relu 4.
// A second key (0, 0) scores 0.
TEST(OpsIndexScores, HandComputedRoundingAndRelu) {
  const std::vector<float> q = {256, 1, 255, 0, -3, 0};
  const std::vector<float> w = {1, -1, -1};
  const std::vector<float> keys = {1, 1, 0, 0};
  std::vector<float> scores(2);
  index_scores(q.data(), w.data(), 3, 2, keys.data(), 2, scores.data());
  EXPECT_EQ(scores, std::vector<float>({1.0f, 0.0f}));
}

// General bf16 inputs: the op's fp32 dot may differ from the double one in its last bits, and
// where that straddles a bf16 midpoint, a term moves by one bf16 ulp (<= 2^-7 of its size). So:
// within 2^-7 · Σ_h |term_h| + one ulp of the score, and equal to the naive value for most keys.
TEST(OpsIndexScores, GeneralBf16InputsWithinOneUlpPerTerm) {
  const int heads = 8, hd = 64;
  const int64_t n = 500;
  const std::vector<float> q = bf16_normal(size_t(heads) * hd, 1.0, 4);
  const std::vector<float> keys = bf16_normal(size_t(n) * hd, 1.0, 5);
  const std::vector<float> w = bf16_normal(size_t(heads), 0.3, 6);
  std::vector<float> scores(static_cast<size_t>(n));
  index_scores(q.data(), w.data(), heads, hd, keys.data(), n, scores.data());
  const std::vector<float> expected = naive_index_scores(q, w, heads, hd, keys, n);
  int exact = 0;
  for (int64_t t = 0; t < n; ++t) {
    double abs_terms = 0;
    for (int h = 0; h < heads; ++h) {
      double dot = 0;
      for (int c = 0; c < hd; ++c) dot += double(q[size_t(h) * hd + c]) * keys[size_t(t) * hd + c];
      abs_terms += std::fabs(std::max(dot, 0.0) * w[h]);
    }
    EXPECT_NEAR(scores[t], expected[t], 0x1p-7 * abs_terms + bf16_ulp(expected[t])) << "key " << t;
    exact += scores[t] == expected[t];
  }
  EXPECT_GE(exact, n * 95 / 100);
}

// ---- top_positions ----

// The k best by (score descending, position ascending), then in position order.
std::vector<int64_t> naive_top(const std::vector<float>& s, int64_t k) {
  std::vector<int64_t> order(s.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
  order.resize(size_t(std::min<int64_t>(k, int64_t(s.size()))));
  std::sort(order.begin(), order.end());
  return order;
}

TEST(OpsTopPositions, HandCases) {
  const std::vector<float> s = {1, 5, 3, 5, 2};
  EXPECT_EQ(top_positions(s.data(), 5, 2), std::vector<int64_t>({1, 3}));
  EXPECT_EQ(top_positions(s.data(), 5, 3), std::vector<int64_t>({1, 2, 3}));
  EXPECT_EQ(top_positions(s.data(), 5, 0), std::vector<int64_t>());
  // k > n: every position, in order
  EXPECT_EQ(top_positions(s.data(), 5, 9), std::vector<int64_t>({0, 1, 2, 3, 4}));
  // ties go to the lower position (torch.topk leaves their order unspecified; this is ours)
  const std::vector<float> t = {2, 7, 7, 7, 1};
  EXPECT_EQ(top_positions(t.data(), 5, 2), std::vector<int64_t>({1, 2}));
  EXPECT_EQ(top_positions(t.data(), 5, 1), std::vector<int64_t>({1}));
  // -inf positions are picked last, lowest first (the forward drops the unreachable ones itself)
  const std::vector<float> u = {-kInf, 1, -kInf, -kInf};
  EXPECT_EQ(top_positions(u.data(), 4, 2), std::vector<int64_t>({0, 1}));
  // the output is in position order, not score order
  const std::vector<float> v = {0.5f, -1, 9, 3};
  EXPECT_EQ(top_positions(v.data(), 4, 3), std::vector<int64_t>({0, 2, 3}));
  EXPECT_EQ(top_positions(v.data(), 0, 3), std::vector<int64_t>());
}

// Against the naive selection over many ties (scores in 0..9) and continuous scores.
TEST(OpsTopPositions, MatchesNaiveSelection) {
  std::mt19937 rng(7);
  std::vector<float> ties(1000), cont(1000);
  for (float& v : ties) v = float(rng() % 10);
  for (float& v : cont) v = round_bf16(std::normal_distribution<float>(0, 1)(rng));
  for (int64_t k : {1, 7, 64, 500, 999, 1000, 1500})
    for (const std::vector<float>* s : {&ties, &cont})
      EXPECT_EQ(top_positions(s->data(), int64_t(s->size()), k), naive_top(*s, k)) << "k = " << k;
}

// ---- candidate_mask ----

std::vector<uint8_t> mask_of(const std::string& bits) {
  std::vector<uint8_t> m;
  for (char c : bits)
    if (c == '0' || c == '1') m.push_back(uint8_t(c - '0'));
  return m;
}

// n = 10 positions, blocks of 4: {0..3}, {4..7} and {8, 9} padded with -inf.
TEST(OpsCandidateMask, HandBuiltCases) {
  const std::vector<float> s = {0.1f, 0.9f, 0.2f, 0.3f, 0.5f, 0.4f, 0.45f, 0.2f, 0.0f, -1.0f};
  // compress_len 10: block 2 holds the newest position 9, pinned in; block 0 (best 0.9) beats
  // block 1 (0.5) for the other pick
  EXPECT_EQ(candidate_mask(s.data(), 10, 10, 2, 4), mask_of("1111 0000 11"));
  EXPECT_EQ(candidate_mask(s.data(), 10, 10, 1, 4), mask_of("0000 0000 11"));
  EXPECT_EQ(candidate_mask(s.data(), 10, 10, 3, 4), mask_of("1111 1111 11"));

  // prefill row of a query that sees 6 positions: the rest are -inf; block 1 holds position 5 and is
  // pinned (its unreachable positions 6, 7 are in the mask too: the whole block is kept); block 2
  // is all -inf and is dropped although topk_blocks allows it
  const std::vector<float> p = {0.1f, 0.9f, 0.2f, 0.3f, 0.5f, 0.4f, -kInf, -kInf, -kInf, -kInf};
  EXPECT_EQ(candidate_mask(p.data(), 10, 6, 3, 4), mask_of("1111 1111 00"));
  EXPECT_EQ(candidate_mask(p.data(), 10, 6, 1, 4), mask_of("0000 1111 00"));
  // compress_len 4: the newest position 3 is in block 0, pinned; with one pick, block 0
  EXPECT_EQ(candidate_mask(p.data(), 10, 4, 1, 4), mask_of("1111 0000 00"));

  // compress_len 0: no block is pinned ((0 - 1) // 4 = -1); with nothing reachable, nothing is kept
  const std::vector<float> none(10, -kInf);
  EXPECT_EQ(candidate_mask(none.data(), 10, 0, 3, 4), mask_of("0000 0000 00"));
  // and finite scores are ranked as they are
  EXPECT_EQ(candidate_mask(s.data(), 10, 0, 1, 4), mask_of("1111 0000 00"));

  // the pinned block is kept even when all its scores are -inf (a level-two row), and outranks any
  // finite block
  const std::vector<float> q = {1, 2, 3, 4, -kInf, -kInf, -kInf, -kInf};
  EXPECT_EQ(candidate_mask(q.data(), 8, 8, 1, 4), mask_of("0000 1111"));
  EXPECT_EQ(candidate_mask(q.data(), 8, 8, 2, 4), mask_of("1111 1111"));
  // a newest position past the last block pins nothing ((9 - 1) // 4 = 2, no block 2)
  EXPECT_EQ(candidate_mask(q.data(), 8, 9, 1, 4), mask_of("1111 0000"));

  // equal block scores: the lower block wins (torch.topk's order among ties is unspecified)
  const std::vector<float> t = {5, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(candidate_mask(t.data(), 12, 12, 2, 4), mask_of("1111 0000 1111"));

  // more blocks asked for than exist: every block with a finite score
  EXPECT_EQ(candidate_mask(s.data(), 5, 5, 10, 4), mask_of("1111 1"));
  // block size 1: plain top-k over positions, plus the newest one
  EXPECT_EQ(candidate_mask(s.data(), 10, 3, 2, 1), mask_of("0110 0000 00"));
  EXPECT_EQ(candidate_mask(s.data(), 10, 9, 2, 1), mask_of("0100 0000 10"));
}

// The selection written out: block scores by max over their positions (the last block padded),
// the block of position compress_len - 1 set to +inf, the best topk_blocks by (score, lower index),
// those with a finite score kept.
std::vector<uint8_t> naive_candidates(const std::vector<float>& s, int64_t compress_len, int topk_blocks, int bs) {
  const int64_t n = int64_t(s.size()), blocks = (n + bs - 1) / bs;
  std::vector<float> score(size_t(blocks), -kInf);
  for (int64_t t = 0; t < n; ++t) score[size_t(t / bs)] = std::max(score[size_t(t / bs)], s[size_t(t)]);
  if (compress_len > 0 && (compress_len - 1) / bs < blocks) score[size_t((compress_len - 1) / bs)] = kInf;
  std::vector<uint8_t> mask(size_t(n), 0);
  for (int64_t b : naive_top(score, topk_blocks))
    if (score[size_t(b)] > -kInf)
      for (int64_t t = b * bs; t < std::min(n, (b + 1) * bs); ++t) mask[size_t(t)] = 1;
  return mask;
}

TEST(OpsCandidateMask, MatchesNaiveSelection) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0, 1);
  const int64_t n = 1000;
  std::vector<float> s(static_cast<size_t>(n));
  for (float& v : s) v = round_bf16(normal(rng));
  for (int bs : {16, 64, 100})
    for (int topk_blocks : {1, 3, 8, 40})
      for (int64_t len : {int64_t(1), int64_t(100), int64_t(700), n}) {
        std::vector<float> row = s;  // a prefill row: positions from len on are unreachable
        for (int64_t t = len; t < n; ++t) row[size_t(t)] = -kInf;
        const std::vector<uint8_t> got = candidate_mask(row.data(), n, len, topk_blocks, bs);
        EXPECT_EQ(got, naive_candidates(row, len, topk_blocks, bs))
            << "block " << bs << " topk " << topk_blocks << " len " << len;
        // the block of the newest position is always in
        EXPECT_EQ(got[size_t(len - 1)], 1) << "block " << bs << " topk " << topk_blocks << " len " << len;
      }
}

// ---- pool_group ----

// out_c = Σ_t kv_tc · softmax_t(score_tc), in double, and a tolerance for the op's fp32: each weight
// is exp(score - max) / Σ, whose fp32 evaluation errs by about (m + 4) · 2^-24 relative plus
// |score - max| · 2^-24 (the rounded difference fed to exp); the weighted sum adds m · 2^-24. With
// A = Σ_t p_t |kv_tc|: tol = (2m + 8 + max |score - max|) · 2^-24 · A.
void naive_pool(const std::vector<float>& kv, const std::vector<float>& score, int m, int d, std::vector<double>& out,
                std::vector<double>& tol) {
  out.assign(size_t(d), 0);
  tol.assign(size_t(d), 0);
  for (int c = 0; c < d; ++c) {
    double mx = -INFINITY;
    for (int t = 0; t < m; ++t) mx = std::max(mx, double(score[size_t(t) * d + c]));
    double sum = 0, spread = 0;
    for (int t = 0; t < m; ++t) {
      sum += std::exp(score[size_t(t) * d + c] - mx);
      if (std::isfinite(score[size_t(t) * d + c])) spread = std::max(spread, mx - score[size_t(t) * d + c]);
    }
    double acc = 0, abs_acc = 0;
    for (int t = 0; t < m; ++t) {
      const double p = std::exp(score[size_t(t) * d + c] - mx) / sum;
      acc += p * kv[size_t(t) * d + c];
      abs_acc += p * std::fabs(kv[size_t(t) * d + c]);
    }
    out[size_t(c)] = acc;
    tol[size_t(c)] = (2 * m + 8 + spread) * kF32Unit * abs_acc;
  }
}

// The ratio-2 compressor of V4.1 and ratio 4; fp32 inputs (the compressor runs in fp32).
TEST(OpsPoolGroup, MatchesNaiveSoftmaxPooling) {
  std::mt19937 rng(20);
  std::normal_distribution<float> normal(0, 1);
  for (int m : {2, 4}) {
    const int d = 128;
    std::vector<float> kv(size_t(m) * d), score(size_t(m) * d);
    for (float& v : kv) v = normal(rng) * 2.0f;
    for (float& v : score) v = normal(rng) * 4.0f;
    std::vector<float> out(d);
    pool_group(kv.data(), score.data(), m, d, out.data());
    std::vector<double> ref, tol;
    naive_pool(kv, score, m, d, ref, tol);
    for (int c = 0; c < d; ++c) EXPECT_NEAR(out[c], ref[c], tol[c]) << "m " << m << " channel " << c;
  }
}

// Hand cases: equal scores give the plain mean (p = 1/2 or 1/4 exactly); a -inf score (an empty
// slot of the reference's score_state) has weight exactly 0; one row is the identity; large scores
// do not overflow (the max is subtracted first): 1000 and 999 weigh 1 / (1 + e^-1) and e^-1 / (1 + e^-1).
TEST(OpsPoolGroup, HandComputedCases) {
  std::vector<float> out(2);
  {
    const std::vector<float> kv = {1, -2, 3, 6}, score = {0.5f, 7, 0.5f, 7};  // m = 2, d = 2
    pool_group(kv.data(), score.data(), 2, 2, out.data());
    EXPECT_EQ(out, std::vector<float>({2, 2}));
  }
  {
    const std::vector<float> kv = {1, 2, 3, 4, 5, 6, 7, 10}, score(8, -3.0f);  // m = 4, d = 2
    pool_group(kv.data(), score.data(), 4, 2, out.data());
    EXPECT_EQ(out, std::vector<float>({4, 5.5f}));
  }
  {
    const std::vector<float> kv = {1.5f, -2, 7, 9}, score = {-kInf, 3, 5, -kInf};
    pool_group(kv.data(), score.data(), 2, 2, out.data());
    EXPECT_EQ(out, std::vector<float>({7, -2}));
  }
  {
    const std::vector<float> kv = {0.1f, -0.3f}, score = {123, -5};
    pool_group(kv.data(), score.data(), 1, 2, out.data());
    EXPECT_EQ(out, kv);
  }
  {
    const std::vector<float> kv = {1, 0, 0, 1}, score = {1000, 999, 999, 1000};
    pool_group(kv.data(), score.data(), 2, 2, out.data());
    const double e = std::exp(-1.0), big = 1 / (1 + e), small = e / (1 + e);
    EXPECT_NEAR(out[0], big, 8 * kF32Unit);
    EXPECT_NEAR(out[1], big, 8 * kF32Unit);
    const std::vector<float> kv2 = {0, 1, 1, 0};
    pool_group(kv2.data(), score.data(), 2, 2, out.data());
    EXPECT_NEAR(out[0], small, 8 * kF32Unit);
    EXPECT_NEAR(out[1], small, 8 * kF32Unit);
  }
}

}  // namespace
}  // namespace dsv41
