// Unit tests of src/backend/cpu/sparse_attention.h against a naive softmax in double.
//
// The reference (kernel sparse_attn) attends one query's heads over a gathered list of shared K = V
// entries, index -1 contributing nothing, with exp(sink_h) added to each head's denominator; the
// sink is not multiplied by the softmax scale. With scores s_j = scale · q_h · k_j over the valid
// entries and any shift M:
//     out_h = Σ_j e^{s_j - M} v_j / (Σ_j e^{s_j - M} + e^{sink_h - M}).
// The kernel runs that as an online softmax over blocks of 64 entries and rounds each probability
// to bf16 (relative to the running maximum) before the P · V product; the output is bf16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/sparse_attention.h"
#include "numerics/types.h"
#include "ops_util.h"

namespace dsv41 {
namespace {

using test::bf16_normal;
using test::bf16_ulp;
using test::kF32Unit;

const float kInf = std::numeric_limits<float>::infinity();

struct NaiveAttention {
  std::vector<double> out;  // [heads, d]
  std::vector<double> tol;  // [heads, d]
};

// The formula above in double, with M = max(max_j s_j, sink_h); and the tolerance of each output.
//
// Tolerance, per output channel c of head h, with A = Σ_j p_j |v_jc| / D (p_j = e^{s_j - M}, D the
// denominator):
//  * the bf16 rounding of each probability errs by at most 2^-8 relative (half an ulp; bf16 keeps
//    8 significant bits), so the numerator by at most 2^-8 · Σ_j p_j |v_jc|: 2^-8 · A;
//  * the fp32 scores err by at most d · 2^-24 · scale · Σ_c |q_c k_c| = Δs (any summation order),
//    which moves each p_j (numerator and denominator) by a factor e^{±Δs}: 2 Δs · A;
//  * the fp32 exps, block rescalings and sums add about (n + 8) · 2^-24 relative: (n + 8) u · A;
//  * the output is rounded to bf16: one ulp of the exact value covers that half ulp (and a value
//    pushed across a binade edge).
// A formula error (a lost sink, a scaled sink, a wrong maximum, a dropped block) is orders larger.
NaiveAttention naive_attention(const std::vector<float>& q, int heads, int d, const std::vector<const float*>& entries,
                               const std::vector<float>& sink, float scale) {
  NaiveAttention r;
  r.out.assign(size_t(heads) * d, 0.0);
  r.tol.assign(size_t(heads) * d, 0.0);
  const size_t n = entries.size();
  for (int h = 0; h < heads; ++h) {
    const float* qh = q.data() + size_t(h) * d;
    std::vector<double> s(n, -INFINITY);
    double M = sink[h], ds = 0;
    for (size_t j = 0; j < n; ++j) {
      if (!entries[j]) continue;
      double dot = 0, abs_dot = 0;
      for (int c = 0; c < d; ++c) {
        dot += double(qh[c]) * entries[j][c];
        abs_dot += std::fabs(double(qh[c]) * entries[j][c]);
      }
      s[j] = double(scale) * dot;
      M = std::max(M, s[j]);
      ds = std::max(ds, d * kF32Unit * scale * abs_dot);
    }
    double D = std::exp(double(sink[h]) - M);
    for (size_t j = 0; j < n; ++j)
      if (entries[j]) D += std::exp(s[j] - M);
    const double rel = 0x1p-8 + 2 * ds + double(n + 8) * kF32Unit;
    for (int c = 0; c < d; ++c) {
      double num = 0, abs_num = 0;
      for (size_t j = 0; j < n; ++j) {
        if (!entries[j]) continue;
        const double p = std::exp(s[j] - M);
        num += p * entries[j][c];
        abs_num += p * std::fabs(entries[j][c]);
      }
      const double out = num / D;
      r.out[size_t(h) * d + c] = out;
      r.tol[size_t(h) * d + c] = rel * abs_num / D + bf16_ulp(out);
    }
  }
  return r;
}

void expect_attention(const std::vector<float>& out, const NaiveAttention& ref, const std::string& what) {
  int bad = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!(std::fabs(double(out[i]) - ref.out[i]) <= ref.tol[i]) && ++bad <= 5)
      ADD_FAILURE() << what << " output " << i << ": " << out[i] << " vs naive " << ref.out[i] << " (tol "
                    << ref.tol[i] << ")";
    if (out[i] != round_bf16(out[i]) && ++bad <= 5) ADD_FAILURE() << what << " output " << i << " not bf16";
  }
  EXPECT_EQ(bad, 0) << what;
}

// n key/value vectors (bf16), the j-th scaled by 1 + j / 50 so that later blocks hold larger scores
// and the running maximum moves from block to block.
std::vector<std::vector<float>> make_keys(int n, int d, uint32_t seed) {
  std::vector<std::vector<float>> keys(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) {
    keys[j] = bf16_normal(size_t(d), 1.0 + j / 50.0, seed + uint32_t(j));
  }
  return keys;
}

std::vector<const float*> pointers(const std::vector<std::vector<float>>& keys) {
  std::vector<const float*> p;
  for (const auto& k : keys) p.push_back(k.data());
  return p;
}

// More than three blocks of 64, some slots empty, heads with sinks from none (-inf: a plain softmax)
// to dominant.
TEST(OpsSparseAttention, MatchesNaiveSoftmaxWithSinkAcrossBlocks) {
  const int heads = 6, d = 64, n = 209;
  const float scale = 0.125f;  // d^-0.5
  const auto keys = make_keys(n, d, 1000);
  std::vector<const float*> entries = pointers(keys);
  std::mt19937 rng(5);
  for (auto& e : entries)
    if (rng() % 7 == 0) e = nullptr;  // the reference's index -1
  const std::vector<float> q = bf16_normal(size_t(heads) * d, 1.0, 6);
  const std::vector<float> sink = {-kInf, -4.0f, 0.0f, 0.75f, 3.0f, 12.0f};
  std::vector<float> out(size_t(heads) * d);
  sparse_attention(q.data(), heads, d, entries, sink.data(), scale, out.data());
  expect_attention(out, naive_attention(q, heads, d, entries, sink, scale), "209 entries");

  // Every count around the block edge: 63, 64, 65, 128, 129 entries.
  for (int m : {1, 63, 64, 65, 128, 129}) {
    std::vector<const float*> part(entries.begin(), entries.begin() + m);
    sparse_attention(q.data(), heads, d, part, sink.data(), scale, out.data());
    expect_attention(out, naive_attention(q, heads, d, part, sink, scale), std::to_string(m) + " entries");
  }
}

// Sharp softmaxes: scores over a range of ~40, so blocks' maxima differ by a lot and most of the
// weight sits on few entries (the rescaling of earlier blocks is what carries the result).
TEST(OpsSparseAttention, SharpScoresAcrossBlocks) {
  const int heads = 3, d = 32, n = 150;
  const float scale = 1.0f;
  const auto keys = make_keys(n, d, 2000);
  const std::vector<const float*> entries = pointers(keys);
  const std::vector<float> q = bf16_normal(size_t(heads) * d, 1.0, 7);
  const std::vector<float> sink = {0.0f, 5.0f, -1.0f};
  std::vector<float> out(size_t(heads) * d);
  sparse_attention(q.data(), heads, d, entries, sink.data(), scale, out.data());
  expect_attention(out, naive_attention(q, heads, d, entries, sink, scale), "sharp");
}

// Hand cases, exact. One entry v with score s = scale · q · v = 0.5 · 2 = 1:
//  * sink = 1: p = e^0 = 1, D = 1 + e^0 = 2, out = v / 2;
//  * sink = -inf: out = v;
//  * the sink is not scaled: with scale 0.25 (s = 0.5) and sink 0.5, out = v / 2 again.
// Two entries with equal scores and no sink: out = (v1 + v2) / 2.
TEST(OpsSparseAttention, HandComputedCases) {
  const int d = 4;
  const std::vector<float> v = {2.0f, 1.0f, -3.0f, 0.5f};
  const std::vector<float> q = {1.0f, 0.0f, 0.0f, 0.0f};
  std::vector<float> out(d);
  float sink = 1.0f;
  sparse_attention(q.data(), 1, d, {v.data()}, &sink, 0.5f, out.data());
  EXPECT_EQ(out, std::vector<float>({1.0f, 0.5f, -1.5f, 0.25f}));
  sink = -kInf;
  sparse_attention(q.data(), 1, d, {v.data()}, &sink, 0.5f, out.data());
  EXPECT_EQ(out, v);
  sink = 0.5f;
  sparse_attention(q.data(), 1, d, {v.data()}, &sink, 0.25f, out.data());
  EXPECT_EQ(out, std::vector<float>({1.0f, 0.5f, -1.5f, 0.25f}));

  const std::vector<float> q2 = {1.0f, 1.0f, 0.0f, 0.0f};
  const std::vector<float> v1 = {1.0f, 0.0f, 2.0f, 0.0f}, v2 = {0.0f, 1.0f, 0.0f, -2.0f};  // q2 · v = 1 each
  sink = -kInf;
  sparse_attention(q2.data(), 1, d, {v1.data(), v2.data()}, &sink, 1.0f, out.data());
  EXPECT_EQ(out, std::vector<float>({0.5f, 0.5f, 1.0f, -1.0f}));

  // Two heads over the same entry, each with its own query and sink.
  const std::vector<float> q3 = {1.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // head 1: score 0
  const std::vector<float> sinks = {1.0f, 0.0f};
  std::vector<float> out2(2 * d);
  sparse_attention(q3.data(), 2, d, {v.data()}, sinks.data(), 0.5f, out2.data());
  EXPECT_EQ(out2, std::vector<float>({1.0f, 0.5f, -1.5f, 0.25f, 1.0f, 0.5f, -1.5f, 0.25f}));
}

// The probabilities are rounded to bf16 against the running maximum, so where an entry sits matters
// to the last bit. Entries v1 = e3 (score 0) and v2 = -e0 (score -1), q = e0, scale 1, no sink:
//  * both in one block: the maximum is 0, p2 = bf16(e^-1) = 0.3671875, and
//    out0 = bf16(-0.3671875 / (1 + e^-1)) = -0.267578125;
//  * v2 alone in the first block: its p is bf16(e^0) = 1, later rescaled by the fp32 e^-1, so
//    out0 = bf16(-e^-1 / (1 + e^-1)) = -0.26953125, the unrounded value.
// out3 = bf16(1 / (1 + e^-1)) = 0.73046875 either way (the denominator uses unrounded fp32 p).
TEST(OpsSparseAttention, ProbabilitiesAreRoundedToBf16AgainstTheRunningMax) {
  const int d = 4;
  const std::vector<float> q = {1, 0, 0, 0}, v1 = {0, 0, 0, 1}, v2 = {-1, 0, 0, 0};
  const float sink = -kInf;
  const double e = std::exp(-1.0);
  ASSERT_EQ(round_bf16(float(e)), 0.3671875f);
  std::vector<float> out(d);
  sparse_attention(q.data(), 1, d, {v1.data(), v2.data()}, &sink, 1.0f, out.data());
  EXPECT_EQ(out, std::vector<float>({round_bf16(float(-0.3671875 / (1 + e))), 0, 0, round_bf16(float(1 / (1 + e)))}));
  EXPECT_EQ(out[0], -0.267578125f);

  std::vector<const float*> split(64, nullptr);
  split[0] = v2.data();
  split.push_back(v1.data());  // slot 64: the second block
  sparse_attention(q.data(), 1, d, split, &sink, 1.0f, out.data());
  EXPECT_EQ(out, std::vector<float>({round_bf16(float(-e / (1 + e))), 0, 0, round_bf16(float(1 / (1 + e)))}));
  EXPECT_EQ(out[0], -0.26953125f);
  EXPECT_EQ(out[3], 0.73046875f);
}

// Empty slots contribute nothing: inside one block, interleaving null entries gives the same bits
// as leaving them out (same maximum, zero terms added). Across blocks (empty slots shift which
// block an entry falls in) the result still matches the naive value of the valid entries.
TEST(OpsSparseAttention, EmptySlotsContributeNothing) {
  const int heads = 2, d = 16;
  const auto keys = make_keys(40, d, 3000);
  const std::vector<float> q = bf16_normal(size_t(heads) * d, 1.0, 8);
  const std::vector<float> sink = {0.5f, -2.0f};
  std::vector<const float*> dense = pointers(keys), holey;
  for (const float* k : dense) {
    holey.push_back(nullptr);
    holey.push_back(k);
  }
  holey.resize(60);  // 30 valid entries among 60 slots: still one block
  dense.resize(30);
  std::vector<float> a(size_t(heads) * d), b(size_t(heads) * d);
  sparse_attention(q.data(), heads, d, dense, sink.data(), 0.25f, a.data());
  sparse_attention(q.data(), heads, d, holey, sink.data(), 0.25f, b.data());
  EXPECT_EQ(a, b);

  // A whole first block of empty slots, then entries: the running maximum stays at its floor
  // through the empty block.
  std::vector<const float*> late(64, nullptr);
  for (const float* k : dense) late.push_back(k);
  late.push_back(nullptr);
  sparse_attention(q.data(), heads, d, late, sink.data(), 0.25f, b.data());
  expect_attention(b, naive_attention(q, heads, d, late, sink, 0.25f), "after an empty block");
}

// A row with no valid entry (all slots empty, or none at all) gives zeros, not NaN: the running
// maximum starts at the finite -1e30, so exp(-inf - (-1e30)) = 0 and the sink alone fills D.
TEST(OpsSparseAttention, AllEmptyRowsGiveZeros) {
  const int heads = 2, d = 8;
  const std::vector<float> q = bf16_normal(size_t(heads) * d, 1.0, 9);
  const std::vector<float> sink = {0.5f, 30.0f};
  for (size_t n : {size_t(0), size_t(1), size_t(64), size_t(130)}) {
    const std::vector<const float*> empty(n, nullptr);
    std::vector<float> out(size_t(heads) * d, -7.0f);
    sparse_attention(q.data(), heads, d, empty, sink.data(), 0.125f, out.data());
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], 0.0f) << n << " empty slots, output " << i;
  }
}

// A huge sink drives the output to 0: with sink 40 over scores near 0 the output is the values
// times ~e^-40 (matched against the naive value, relative); with sink 1e4 exp overflows fp32 to
// infinity and the output is exactly 0 (as in the reference, which computes the same fp32 exp).
TEST(OpsSparseAttention, HugeSinkDrivesTheOutputToZero) {
  const int heads = 1, d = 32, n = 20;
  const auto keys = make_keys(n, d, 4000);
  const std::vector<const float*> entries = pointers(keys);
  const std::vector<float> q = bf16_normal(d, 0.1, 10);
  std::vector<float> out(d);
  std::vector<float> sink = {40.0f};
  sparse_attention(q.data(), heads, d, entries, sink.data(), 0.125f, out.data());
  const NaiveAttention ref = naive_attention(q, heads, d, entries, sink, 0.125f);
  expect_attention(out, ref, "sink 40");
  for (int c = 0; c < d; ++c) EXPECT_LT(std::fabs(out[c]), 1e-15f);
  sink = {1e4f};
  sparse_attention(q.data(), heads, d, entries, sink.data(), 0.125f, out.data());
  for (int c = 0; c < d; ++c) EXPECT_EQ(out[c], 0.0f) << c;
}

}  // namespace
}  // namespace dsv41
