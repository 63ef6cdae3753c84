// cuda::sparse_attention (decode over the SWA-FP8 ring and the KV-FP4 cache) against the CPU op
// fed the same entries decoded by the codecs, at the V4.1-Flash shape (64 heads × 512, window
// 128, top-k 512) for 1 to 40 tokens (every heads-per-block choice of the one-block-per-head-group
// path) and a small shape with empty slots; each case runs both kernel paths, which must agree
// bit for bit.
//
// Tolerance: the GPU runs the CPU's online softmax step for step (tiles of 64, the same running
// maximum, probabilities rounded to bf16 before P·V, entry order in P·V); the dot products and
// denominators are fp32 sums in another order and expf may differ in the last bit. A score that
// moves by a few fp32 units moves its probability by as much, which flips the probability's bf16
// rounding (2^-8 relative) only when it sits at a boundary; outputs are bf16-rounded too. With
// ~1e-4 of the probabilities and outputs flipping, NMSE ~ 1e-4 · 2^-16 / 3 ≈ 5e-10; bound 1e-7.
// Decoding an entry wrongly (a scale, a nibble order) gives NMSE > 1e-3.
//
// The two paths (one block walking a token's tiles; three kernels split over the tiles) compute
// every intermediate value with the same device functions in the same order, so their outputs
// must be equal to the bit, empty slots and entirely empty tiles included.
//
// The tensor-core path (D = 512, heads a multiple of 32) runs the same softmax steps, but its
// scores and P·V sums are bf16 mma with fp32 accumulation, which aligns and truncates over the 32
// k-steps of a score (relative error up to 32·2^-24 ≈ 2e-6 of the terms, where the CUDA-core
// order's is ~1e-7) and rescales the accumulator before adding a tile's products. For unit normal
// q and entries a score (~N(0, 1) after the 1/√512 scale) moves by ~1e-6, a probability as much
// relative, flipping its bf16 rounding with probability ~1e-6 / 2^-8 ≈ 3e-4, and an output's bf16
// rounding flips as rarely: NMSE ~ 5e-4 · 2^-16 / 3 ≈ 3e-9, under the same bound 1e-7.
// The warpgroup path (D = 512, heads a multiple of 64) differs from the tensor-core one only in
// the order of the same fp32 sums (wgmma's instead of mma.sync's; the denominator as two halves'
// sums): the same argument and bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/sparse_attention.h"
#include "backend/cuda/sparse_attention.h"
#include "device_util.h"
#include "numerics/codecs.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Case {
  int B, H, D, W, K, entries;  // `entries` compressed entries per token's cache
  int empty_window, empty_topk;  // empty slots at the window's front and the top-k's end
};

// The CPU op's output and both GPU paths' for one case.
struct Outputs {
  // tensor_cores, warpgroups: empty where the shape has no such path
  std::vector<float> want, head_groups, split_tiles, tensor_cores, warpgroups, split_tensor_cores;
};

Outputs run(const Case& c, uint32_t seed) {
  const size_t swa = swa_fp8::bytes(c.D), kv = kv_fp4::bytes(c.D);
  std::vector<uint8_t> rings(size_t(c.B) * c.W * swa), caches(size_t(c.B) * c.entries * kv);
  std::vector<float> ring_f(size_t(c.B) * c.W * c.D), cache_f(size_t(c.B) * c.entries * c.D);
  {
    const std::vector<float> a = test::bf16_normal(ring_f.size(), 1.0, seed), b = test::bf16_normal(cache_f.size(), 1.0, seed + 1);
    for (size_t e = 0; e < size_t(c.B) * c.W; ++e) {
      swa_fp8::encode(a.data() + e * c.D, c.D, rings.data() + e * swa);
      swa_fp8::decode(rings.data() + e * swa, c.D, ring_f.data() + e * c.D);
    }
    for (size_t e = 0; e < size_t(c.B) * c.entries; ++e) {
      kv_fp4::encode(b.data() + e * c.D, c.D, caches.data() + e * kv);
      kv_fp4::decode(caches.data() + e * kv, c.D, cache_f.data() + e * c.D);
    }
  }
  std::mt19937 rng(seed + 2);
  std::vector<int32_t> window(size_t(c.B) * c.W), topk(size_t(c.B) * c.K);
  for (int b = 0; b < c.B; ++b) {
    int32_t* w = window.data() + size_t(b) * c.W;
    std::iota(w, w + c.W, 0);
    std::shuffle(w, w + c.W, rng);
    std::fill(w, w + std::min(c.empty_window, c.W), -1);
    std::vector<int32_t> all(static_cast<size_t>(c.entries));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    int32_t* t = topk.data() + size_t(b) * c.K;
    std::copy_n(all.begin(), c.K, t);
    std::sort(t, t + c.K);
    std::fill(t + c.K - std::min(c.empty_topk, c.K), t + c.K, -1);
  }
  const std::vector<float> q = test::bf16_normal(size_t(c.B) * c.H * c.D, 1.0, seed + 3);
  const std::vector<float> sink = test::bf16_normal(size_t(c.H), 1.0, seed + 4);
  const float scale = 1.0f / std::sqrt(float(c.D));

  std::vector<float> want(q.size());
  for (int b = 0; b < c.B; ++b) {
    std::vector<const float*> entries;
    for (int j = 0; j < c.W; ++j) {
      const int32_t s = window[size_t(b) * c.W + j];
      entries.push_back(s < 0 ? nullptr : ring_f.data() + (size_t(b) * c.W + s) * c.D);
    }
    for (int j = 0; j < c.K; ++j) {
      const int32_t t = topk[size_t(b) * c.K + j];
      entries.push_back(t < 0 ? nullptr : cache_f.data() + (size_t(b) * c.entries + t) * c.D);
    }
    sparse_attention(q.data() + size_t(b) * c.H * c.D, c.H, c.D, entries, sink.data(), scale,
                     want.data() + size_t(b) * c.H * c.D);
  }

  DeviceArray<uint8_t> drings(rings), dcaches(caches);
  std::vector<const uint8_t*> ring_ptrs, cache_ptrs;
  for (int b = 0; b < c.B; ++b) {
    ring_ptrs.push_back(drings.get() + size_t(b) * c.W * swa);
    cache_ptrs.push_back(dcaches.get() + size_t(b) * c.entries * kv);
  }
  DeviceArray<const uint8_t*> dring_ptrs(ring_ptrs), dcache_ptrs(cache_ptrs);
  DeviceArray<int32_t> dwindow(window);
  std::optional<DeviceArray<int32_t>> dtopk;  // none where K = 0 (an uncompressed layer), as a decode plan
  if (c.K > 0) dtopk.emplace(topk);
  DeviceArray<float> dq(q), dsink(sink);
  cuda::SparseAttentionBatch batch;
  batch.tokens = c.B, batch.heads = c.H, batch.dim = c.D;
  batch.rings = dring_ptrs.get(), batch.window = dwindow.get(), batch.W = c.W;
  batch.caches = c.K > 0 ? dcache_ptrs.get() : nullptr, batch.topk = c.K > 0 ? dtopk->get() : nullptr;
  batch.K = c.K;
  auto gpu = [&](cuda::SparseAttentionPath path) {
    DeviceArray<float> dout(q.size());
    dout.poison();
    batch.path = path;
    cuda::sparse_attention(batch, dq.get(), dsink.get(), scale, dout.get());
    return dout.download();
  };
  const bool mma = c.D == 512 && c.H % 32 == 0, wgmma = c.D == 512 && c.H % 64 == 0;
  return {want, gpu(cuda::SparseAttentionPath::head_groups), gpu(cuda::SparseAttentionPath::split_tiles),
          mma ? gpu(cuda::SparseAttentionPath::tensor_cores) : std::vector<float>{},
          wgmma ? gpu(cuda::SparseAttentionPath::warpgroups) : std::vector<float>{},
          mma ? gpu(cuda::SparseAttentionPath::split_tensor_cores) : std::vector<float>{}};
}

// Both paths against the CPU op, and against each other bit for bit.
void check_case(const Case& c, uint32_t seed) {
  const Outputs o = run(c, seed);
  const double e_groups = test::nmse(o.head_groups, o.want), e_split = test::nmse(o.split_tiles, o.want);
  size_t differ = 0;
  for (size_t i = 0; i < o.want.size(); ++i) differ += std::memcmp(&o.head_groups[i], &o.split_tiles[i], sizeof(float)) != 0;
  std::printf("sparse_attention B=%d H=%d D=%d W=%d K=%d empty %d/%d NMSE %.3g (head groups) %.3g (split tiles), "
              "%zu outputs differ\n",
              c.B, c.H, c.D, c.W, c.K, c.empty_window, c.empty_topk, e_groups, e_split, differ);
  EXPECT_LT(e_groups, 1e-7) << "B=" << c.B << " D=" << c.D;
  EXPECT_LT(e_split, 1e-7) << "B=" << c.B << " D=" << c.D;
  EXPECT_EQ(differ, 0u) << "B=" << c.B << " W=" << c.W << " K=" << c.K;
  if (!o.tensor_cores.empty()) {
    const double e_mma = test::nmse(o.tensor_cores, o.want);
    std::printf("  tensor cores NMSE %.3g\n", e_mma);
    EXPECT_LT(e_mma, 1e-7) << "tensor cores B=" << c.B << " W=" << c.W << " K=" << c.K;
  }
  if (!o.split_tensor_cores.empty()) {
    const double e_split_mma = test::nmse(o.split_tensor_cores, o.want);
    std::printf("  split tensor cores NMSE %.3g\n", e_split_mma);
    EXPECT_LT(e_split_mma, 1e-7) << "split tensor cores B=" << c.B << " W=" << c.W << " K=" << c.K;
  }
  if (!o.warpgroups.empty()) {
    const double e_wg = test::nmse(o.warpgroups, o.want);
    std::printf("  warpgroups NMSE %.3g\n", e_wg);
    EXPECT_LT(e_wg, 1e-7) << "warpgroups B=" << c.B << " W=" << c.W << " K=" << c.K;
  }
}

TEST(CudaSparseAttention, MatchesCpuOverTheStoredCaches) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 7;
  for (const Case c : {Case{1, 64, 512, 128, 512, 4096, 0, 0}, Case{9, 64, 512, 128, 512, 600, 5, 3},
                       Case{20, 64, 512, 128, 512, 600, 0, 100}, Case{40, 64, 512, 128, 512, 520, 127, 0},
                       Case{3, 4, 64, 16, 8, 40, 4, 2}, Case{2, 4, 64, 16, 8, 8, 16, 0}})
    check_case(c, seed += 11);
}

// Prefill-sized calls, which take the tensor-core path automatically (8 tokens and more at 64
// heads) and the warpgroup path from a block per SM (132 tokens on the H200): a full call, a
// part-filled last tile (W = 100), an uncompressed layer (K = 0, its first tile empty), a top-k
// whose last tile is empty, and a call of 140 tokens.
TEST(CudaSparseAttention, ManyTokensMatchCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 301;
  for (const Case c : {Case{80, 64, 512, 128, 512, 600, 5, 3}, Case{70, 64, 512, 100, 512, 600, 3, 7},
                       Case{66, 64, 512, 128, 0, 8, 70, 0}, Case{67, 64, 512, 128, 512, 520, 64, 64},
                       Case{140, 64, 512, 128, 512, 700, 9, 1}})
    check_case(c, seed += 11);
}

// The split path's corners at the V4.1 shape, for token counts that take it automatically (1, 3)
// and one that does not (9): a first tile with no entry (the running maximum stays at its initial
// value), a last tile with none (the top-k's last 100 empty: entries 540 .. 639, all of tile 9),
// the whole window empty (tiles 0 and 1), a part-filled last tile (W = 100: 612 entries), no
// top-k at all (K = 0, an uncompressed layer: two tiles, the first empty), and a token with
// empty first and last tiles.
TEST(CudaSparseAttention, SplitOverTilesIsBitIdentical) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 101;
  for (const Case c : {Case{1, 64, 512, 128, 512, 600, 64, 0}, Case{3, 64, 512, 128, 512, 600, 5, 100},
                       Case{9, 64, 512, 128, 512, 600, 128, 3}, Case{3, 64, 512, 100, 512, 600, 3, 7},
                       Case{1, 64, 512, 128, 0, 8, 70, 0}, Case{9, 64, 512, 128, 512, 520, 64, 64}})
    check_case(c, seed += 11);
}

}  // namespace
}  // namespace dsv41
