// src/train/grad/sparse_attention.h: the backward against central differences (queries, the KV
// table, the sinks) on a prefill's sliding windows plus chosen compressed entries with empty
// slots, and the forward against the CPU op (backend/cpu/sparse_attention.h).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/sparse_attention.h"
#include "forward/window.h"
#include "gradcheck.h"
#include "train/grad/sparse_attention.h"

namespace dsv41 {
namespace {

using test::expect_gradient;
using test::normal_values;
using test::weighted_sum;

// Each row of a prefill of `rows` rows lists its window (forward/window.h, the layout the forward
// uses; positions are the KV table's first rows) and then `chosen[r]` compressed entries, which sit
// in the table after the window rows (−1: an empty slot).
std::vector<int64_t> entry_lists(int64_t rows, int64_t W, const std::vector<std::vector<int64_t>>& chosen) {
  std::vector<int64_t> idx, slots;
  for (int64_t r = 0; r < rows; ++r) {
    window_positions(r, 0, rows, W, 0, slots);
    idx.insert(idx.end(), slots.begin(), slots.end());
    for (int64_t t : chosen[size_t(r)]) idx.push_back(t < 0 ? -1 : rows + t);
  }
  return idx;
}

TEST(GradSparseAttention, GradientsMatchCentralDifferences) {
  const int64_t rows = 5, heads = 2, d = 4, W = 3, compressed = 3;
  const std::vector<std::vector<int64_t>> chosen = {{-1, -1}, {0, -1}, {0, 2}, {1, 0}, {2, -1}};
  const std::vector<int64_t> idx = entry_lists(rows, W, chosen);
  const int64_t entries = int64_t(idx.size()) / rows;
  ASSERT_EQ(entries, W + 2);
  std::vector<double> q = normal_values(size_t(rows * heads * d), 1.0, 1);
  std::vector<double> kv = normal_values(size_t((rows + compressed) * d), 1.0, 2);
  std::vector<double> sink = {0.3, -1.2};
  const double scale = 1 / std::sqrt(double(d));
  const std::vector<double> c = normal_values(q.size(), 1.0, 3);
  std::vector<double> o(q.size());
  grad::SparseAttentionSaved<double> saved;
  auto loss = [&] {
    grad::sparse_attention_forward(q.data(), rows, heads, d, kv.data(), idx.data(), entries, sink.data(), scale, o.data(),
                                   saved);
    return weighted_sum(c, o);
  };
  loss();
  std::vector<double> dq(q.size(), 0.0), dkv(kv.size(), 0.0), dsink(sink.size(), 0.0);
  grad::sparse_attention_backward(q.data(), rows, heads, d, kv.data(), idx.data(), entries, scale, saved, c.data(),
                                  dq.data(), dkv.data(), dsink.data());
  expect_gradient("dq", q, dq, loss);
  expect_gradient("dkv", kv, dkv, loss);
  expect_gradient("dsink", sink, dsink, loss);
}

// Row 0 of a prefill sees itself only: p_0 = e^s / (e^s + e^sink), o = p_0 · kv_0. A row whose
// every slot is empty gives zeros (the CPU op's convention) and passes no gradient to the sink.
TEST(GradSparseAttention, HandComputedRows) {
  const std::vector<double> q = {1, 0}, kv = {2, 1}, sink = {0.5};
  const std::vector<int64_t> idx = {0, -1, -1, -1};
  std::vector<double> o(4);
  grad::SparseAttentionSaved<double> saved;
  const std::vector<double> q2 = {1, 0, 1, 0};
  grad::sparse_attention_forward(q2.data(), 2, 1, 2, kv.data(), idx.data(), 2, sink.data(), 1.0, o.data(), saved);
  const double p0 = std::exp(2.0) / (std::exp(2.0) + std::exp(0.5));
  EXPECT_NEAR(o[0], 2 * p0, 1e-15);
  EXPECT_NEAR(o[1], p0, 1e-15);
  EXPECT_EQ(o[2], 0.0);
  EXPECT_EQ(o[3], 0.0);
  std::vector<double> dq(4, 0.0), dkv(2, 0.0), dsink(1, 0.0);
  const std::vector<double> dout = {0, 0, 1, 1};  // only the empty row's output matters
  grad::sparse_attention_backward(q2.data(), 2, 1, 2, kv.data(), idx.data(), 2, 1.0, saved, dout.data(), dq.data(),
                                  dkv.data(), dsink.data());
  EXPECT_EQ(dsink[0], 0.0);
  EXPECT_EQ(dkv, (std::vector<double>{0, 0}));
}

// The CPU op rounds each probability to bf16 before P·V (relative error ≤ 2⁻⁸: bf16 keeps 8
// significant bits), evaluates the dot products in fp32 (each score s_j off by δs_j ≤ (d + 2) fp32
// units of scale · Σ|q k|, which moves a probability by a factor within e^{±2 max δs}, so by at most
// 2.2 max δs relative for these small δs), and its exps, sums and the division add (entries + 8)
// units; its output rounds to bf16. So each output value is within ρ · Σ_j p_j |kv_j| (ρ the sum
// of those relative errors) before the final half bf16 ulp. 80 entries: two of the op's
// online-softmax blocks of 64.
TEST(GradSparseAttention, ForwardMatchesTheCpuOp) {
  const int64_t heads = 3, d = 64, n = 90, entries = 80;
  const std::vector<float> qf = test::bf16_normal(size_t(heads * d), 1.0, 4), kvf = test::bf16_normal(size_t(n * d), 1.0, 5);
  const std::vector<float> sinkf = {0.5f, -2.0f, 3.0f};
  std::vector<int64_t> idx(static_cast<size_t>(entries));
  std::vector<const float*> ptrs;
  for (int64_t j = 0; j < entries; ++j) {
    idx[size_t(j)] = j % 7 == 3 ? -1 : (j * 37) % n;  // empty slots and a scattered order
    ptrs.push_back(idx[size_t(j)] < 0 ? nullptr : kvf.data() + idx[size_t(j)] * d);
  }
  const float scale = float(1 / std::sqrt(double(d)));
  std::vector<float> o_cpu(size_t(heads * d));
  sparse_attention(qf.data(), int(heads), int(d), ptrs, sinkf.data(), scale, o_cpu.data());

  const std::vector<double> q(qf.begin(), qf.end()), kv(kvf.begin(), kvf.end()), sink(sinkf.begin(), sinkf.end());
  std::vector<double> o(size_t(heads * d));
  grad::SparseAttentionSaved<double> saved;
  grad::sparse_attention_forward(q.data(), 1, heads, d, kv.data(), idx.data(), entries, sink.data(), double(scale),
                                 o.data(), saved);
  for (int64_t h = 0; h < heads; ++h) {
    double max_ds = 0;
    for (int64_t j = 0; j < entries; ++j) {
      if (idx[size_t(j)] < 0) continue;
      double abs_dot = 0;
      for (int64_t c = 0; c < d; ++c) abs_dot += std::fabs(q[size_t(h * d + c)] * kv[size_t(idx[size_t(j)] * d + c)]);
      max_ds = std::max(max_ds, (d + 2) * test::kF32Unit * scale * abs_dot);
    }
    const double rho = 0x1p-8 + 2.2 * max_ds + (entries + 8) * test::kF32Unit;
    for (int64_t c = 0; c < d; ++c) {
      double mass = 0;
      for (int64_t j = 0; j < entries; ++j)
        if (idx[size_t(j)] >= 0) mass += saved.p[size_t(h * entries + j)] * std::fabs(kv[size_t(idx[size_t(j)] * d + c)]);
      const double v = o[size_t(h * d + c)], delta = rho * mass;
      EXPECT_NEAR(o_cpu[size_t(h * d + c)], v, delta + 0.5 * test::bf16_ulp(std::fabs(v) + delta)) << "head " << h << " " << c;
    }
  }
}

}  // namespace
}  // namespace dsv41
