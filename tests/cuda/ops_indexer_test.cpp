// cuda::index_scores, cuda::top_positions and cuda::candidate_mask against the CPU indexer
// (backend/cpu/indexer.h) on the same random inputs: the V4.1-Flash shape (32 heads × 128, top-k
// 512, candidate blocks 2048 of 8) at a 65K-entry cache, other head counts at hd 128 (16 and 48:
// the tensor-core score kernel's other head tiles; 64: the dp4a kernel's), and small odd shapes
// (hd 32 and 64, one head, n below a block of keys, k > n).
//
// Top-k and candidate blocks also at decode's long contexts (one row of 256K and 1M scores, which
// the many-block select spreads over the GPU): scores drawn directly (bf16 normals, a few levels
// with many ties, all tied, -inf masked tails), and the forms that read n from device memory (rows
// n_max apart) against the host-n forms, also replayed in a CUDA graph while n grows; and a batch
// of rows each over its own cache and count (a decode step of several sequences).
//
// Tolerance: none, the results must be identical. Scores: q (fake-quantized to MXFP4 on both
// sides) and the MXFP4 keys make every product exact in fp32, and for inputs like these (block
// scales of one vector within a factor 2^9 of each other) every partial sum too, in any order; the
// GPU's integer block sums are therefore the CPU's fp32 sums, and the head sum, the bf16 roundings
// and the ReLU run in the CPU's order (indexer.cu says why). Top-k and candidate blocks are
// selections: ties are broken by position on both sides, so the positions must match one for one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/indexer.h"
#include "backend/cuda/indexer.h"
#include "device_util.h"
#include "numerics/codecs.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

struct Case {
  int rows, heads, hd;
  int64_t n;
  int topk, topk_blocks, block_size;
};

const Case kCases[] = {
    {1, 32, 128, 65536 + 37, 512, 2048, 8},  // V4.1-Flash decode at a 65K-entry cache
    {4, 32, 128, 4099, 512, 2048, 8},        // a prefill chunk of 4 queries
    {3, 8, 32, 257, 8, 4, 4},                // tiny preset's indexer
    {2, 8, 64, 1000, 64, 16, 8},             // small preset's
    {2, 1, 128, 5, 8, 4, 4},                 // n < k, n < one block of keys
    {3, 64, 128, 3001, 64, 16, 8},           // other head counts at hd 128
    {2, 48, 128, 1000, 64, 16, 8},
    {1, 16, 128, 29, 8, 4, 4},               // fewer keys than one warp's 32
};

size_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  size_t bad = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
  return bad;
}

// The CPU's masked scores of every row, from the same q, w and key bytes the GPU gets.
struct Inputs {
  std::vector<float> q, w;
  std::vector<uint8_t> keys;
  std::vector<int64_t> visible;
  std::vector<float> scores;  // CPU, [rows, n], -inf past visible
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  Inputs in;
  const size_t kb = mxfp4::bytes(c.hd);
  const std::vector<float> k = test::bf16_normal(size_t(c.n) * c.hd, 1.0, seed);
  in.keys.resize(size_t(c.n) * kb);
  std::vector<float> keys(k.size());
  for (int64_t t = 0; t < c.n; ++t) {
    mxfp4::encode(k.data() + t * c.hd, c.hd, in.keys.data() + t * kb);
    mxfp4::decode(in.keys.data() + t * kb, c.hd, keys.data() + t * c.hd);
  }
  in.q = test::bf16_normal(size_t(c.rows) * c.heads * c.hd, 1.0, seed + 1);
  in.w = test::bf16_normal(size_t(c.rows) * c.heads, 0.2, seed + 2);
  in.scores.resize(size_t(c.rows) * c.n);
  for (int r = 0; r < c.rows; ++r) {
    in.visible.push_back(r == 0 ? c.n : std::max<int64_t>(0, c.n - 3 * r - 1));
    std::vector<float> qq(in.q.begin() + size_t(r) * c.heads * c.hd, in.q.begin() + size_t(r + 1) * c.heads * c.hd);
    for (int h = 0; h < c.heads; ++h) mxfp4::quantize_dequantize(qq.data() + h * c.hd, c.hd);
    float* s = in.scores.data() + size_t(r) * c.n;
    index_scores(qq.data(), in.w.data() + r * c.heads, c.heads, c.hd, keys.data(), c.n, s);
    for (int64_t t = in.visible[r]; t < c.n; ++t) s[t] = -INFINITY;
  }
  return in;
}

TEST(CudaIndexer, ScoresAreTheCpuScoresBitForBit) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 300;
  for (const Case& c : kCases) {
    const Inputs in = make_inputs(c, seed += 13);
    DeviceArray<float> dq(in.q), dw(in.w), dscores(in.scores.size());
    DeviceArray<uint8_t> dkeys(in.keys);
    DeviceArray<int64_t> dvisible(in.visible);
    dscores.poison();
    cuda::index_scores(dq.get(), dw.get(), c.rows, c.heads, c.hd, dkeys.get(), c.n, dvisible.get(), dscores.get());
    const std::vector<float> got = dscores.download();
    size_t finite = 0, nonzero = 0;
    for (float v : in.scores) finite += std::isfinite(v), nonzero += std::isfinite(v) && v != 0;
    std::printf("index_scores rows=%d heads=%d hd=%d n=%lld: %zu of %zu differ (%zu finite, %zu non-zero)\n", c.rows,
                c.heads, c.hd, (long long)c.n, bit_mismatches(got, in.scores), got.size(), finite, nonzero);
    EXPECT_EQ(bit_mismatches(got, in.scores), 0u) << "hd=" << c.hd << " n=" << c.n;
    EXPECT_GT(nonzero, finite / 4) << "the test should exercise non-zero scores";
  }
}

TEST(CudaIndexer, TopPositionsAndCandidateBlocksMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 700;
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({2, 1, 32, 600, 600, 200, 3});  // k = n: every position; all blocks
  for (const Case& c : cases) {
    Inputs in = make_inputs(c, seed += 17);
    if (c.rows == 2 && c.n == 600) std::fill(in.scores.begin(), in.scores.begin() + 600, 0.5f);  // all tied
    DeviceArray<float> dscores(in.scores);
    DeviceArray<int64_t> dlen(in.visible);
    DeviceArray<int32_t> dpos(size_t(c.rows) * c.topk);
    DeviceArray<uint8_t> dmask(in.scores.size());
    dpos.poison();
    dmask.poison();
    cuda::top_positions(dscores.get(), c.rows, c.n, c.topk, dpos.get());
    cuda::candidate_mask(dscores.get(), c.rows, c.n, dlen.get(), c.topk_blocks, c.block_size, dmask.get());
    const std::vector<int32_t> pos = dpos.download();
    const std::vector<uint8_t> mask = dmask.download();
    // The device-n forms (rows n_max apart; n_max past n) give the same.
    const int64_t n_max = c.n + 5;
    std::vector<float> wide(size_t(c.rows) * n_max, 1e30f);
    for (int r = 0; r < c.rows; ++r)
      std::copy_n(in.scores.begin() + size_t(r) * c.n, c.n, wide.begin() + size_t(r) * n_max);
    DeviceArray<float> dwide(wide);
    DeviceArray<int64_t> dn(std::vector<int64_t>(size_t(c.rows), c.n));
    DeviceArray<uint8_t> dwide_mask(size_t(c.rows) * n_max);
    dpos.poison();
    cuda::top_positions(dwide.get(), c.rows, dn.get(), n_max, c.topk, dpos.get());
    cuda::candidate_mask(dwide.get(), c.rows, dn.get(), n_max, dlen.get(), c.topk_blocks, c.block_size, dwide_mask.get());
    const std::vector<uint8_t> wide_mask = dwide_mask.download();
    std::vector<uint8_t> dev_mask;
    for (int r = 0; r < c.rows; ++r)
      dev_mask.insert(dev_mask.end(), wide_mask.begin() + size_t(r) * n_max, wide_mask.begin() + size_t(r) * n_max + c.n);
    EXPECT_EQ(dpos.download(), pos) << "device n, n=" << c.n;
    EXPECT_EQ(dev_mask, mask) << "device n, n=" << c.n;
    size_t bad_rows = 0, selected = 0;
    for (int r = 0; r < c.rows; ++r) {
      const float* s = in.scores.data() + size_t(r) * c.n;
      std::vector<int32_t> want(size_t(c.topk), -1);
      const std::vector<int64_t> top = top_positions(s, c.n, c.topk);
      std::copy(top.begin(), top.end(), want.begin());
      const std::vector<int32_t> got(pos.begin() + size_t(r) * c.topk, pos.begin() + size_t(r + 1) * c.topk);
      const std::vector<uint8_t> want_mask = candidate_mask(s, c.n, in.visible[r], c.topk_blocks, c.block_size);
      const std::vector<uint8_t> got_mask(mask.begin() + size_t(r) * c.n, mask.begin() + size_t(r + 1) * c.n);
      bad_rows += got != want || got_mask != want_mask;
      for (uint8_t m : want_mask) selected += m;
    }
    std::printf("top_positions k=%d + candidate_mask %d of %d, rows=%d n=%lld: %zu rows differ (%zu positions in the masks)\n",
                c.topk, c.topk_blocks, c.block_size, c.rows, (long long)c.n, bad_rows, selected);
    EXPECT_EQ(bad_rows, 0u) << "n=" << c.n << " k=" << c.topk;
  }
}


TEST(CudaIndexer, DeviceCountScoresAreTheHostCountScores) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 900;
  for (const Case& c : kCases) {
    const Inputs in = make_inputs(c, seed += 13);
    const int64_t n_max = c.n + 300;  // rows n_max apart; the last 300 of each row left untouched
    DeviceArray<float> dq(in.q), dw(in.w), host_scores(in.scores.size()), dev_scores(size_t(c.rows) * n_max);
    DeviceArray<uint8_t> dkeys(in.keys);
    DeviceArray<int64_t> dvisible(in.visible), dn(std::vector<int64_t>(size_t(c.rows), c.n));
    DeviceArray<const uint8_t*> dcaches(std::vector<const uint8_t*>(size_t(c.rows), dkeys.get()));
    host_scores.poison();
    dev_scores.poison();
    cuda::index_scores(dq.get(), dw.get(), c.rows, c.heads, c.hd, dkeys.get(), c.n, dvisible.get(), host_scores.get());
    cuda::index_scores(dq.get(), dw.get(), c.rows, c.heads, c.hd, dcaches.get(), dn.get(), n_max, dvisible.get(),
                       dev_scores.get());
    const std::vector<float> want = host_scores.download(), got = dev_scores.download();
    std::vector<float> rows_got;
    size_t untouched = 0;
    for (int r = 0; r < c.rows; ++r) {
      rows_got.insert(rows_got.end(), got.begin() + size_t(r) * n_max, got.begin() + size_t(r) * n_max + c.n);
      for (int64_t t = c.n; t < n_max; ++t) untouched += std::isnan(got[size_t(r) * n_max + t]);
    }
    EXPECT_EQ(bit_mismatches(rows_got, want), 0u) << "hd=" << c.hd << " n=" << c.n;
    EXPECT_EQ(untouched, size_t(c.rows) * (n_max - c.n)) << "scores past n are left as they were";
  }
}

// Scores of `rows` rows of n drawn directly, as the indexer's are (bf16 values), in one of a few
// shapes, with the last `masked` of each row -inf (entries not yet visible).
enum class Shape { Normal, FewLevels, AllTied };

std::vector<float> synthetic_scores(int rows, int64_t n, Shape shape, int64_t masked, uint32_t seed) {
  std::vector<float> s(size_t(rows) * n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (int r = 0; r < rows; ++r)
    for (int64_t t = 0; t < n; ++t) {
      float v = shape == Shape::Normal ? round_bf16(nd(rng)) : shape == Shape::FewLevels ? float(rng() % 5) - 2.0f : 0.5f;
      if (shape == Shape::FewLevels && v == 0 && (rng() & 1)) v = -0.0f;  // -0 and +0 tie
      s[size_t(r) * n + t] = t >= n - masked ? -INFINITY : v;
    }
  return s;
}

const char* shape_name(Shape s) { return s == Shape::Normal ? "normal" : s == Shape::FewLevels ? "5 levels" : "all tied"; }

struct LongCase {
  int rows;
  int64_t n, masked;
  Shape shape;
  int topk;
};

// The CPU's positions ([rows, k], -1 past min(k, n)) and masks ([rows, n]).
void cpu_select(const std::vector<float>& s, int rows, int64_t n, int topk, const std::vector<int64_t>& len,
                int topk_blocks, int block_size, std::vector<int32_t>& pos, std::vector<uint8_t>& mask) {
  pos.assign(size_t(rows) * topk, -1);
  mask.clear();
  for (int r = 0; r < rows; ++r) {
    const std::vector<int64_t> top = top_positions(s.data() + size_t(r) * n, n, topk);
    std::copy(top.begin(), top.end(), pos.begin() + size_t(r) * topk);
    const std::vector<uint8_t> m = candidate_mask(s.data() + size_t(r) * n, n, len[size_t(r)], topk_blocks, block_size);
    mask.insert(mask.end(), m.begin(), m.end());
  }
}

// A batch of rows each over its own cache with its own entry count (a decode step of several
// sequences: one launch per op): every row equals the CPU on its own keys. Counts from 0 to 40,000
// in one batch (the many-block select, most of its blocks idle on the short rows) and up to 2,000
// in another (one block per row), at the tensor-core (32 × 128) and dp4a (8 × 64) score kernels.
TEST(CudaIndexer, RowsOverTheirOwnCachesEqualTheCpu) {
  DSV41_REQUIRE_DEVICE();
  const int topk = 512, topk_blocks = 64, block_size = 8;
  const std::vector<std::vector<int64_t>> batches = {{1000, 0, 37, 4099, 1, 40000}, {300, 0, 5, 2000}};
  uint32_t seed = 4242;
  for (const auto& [heads, hd] : {std::pair{32, 128}, std::pair{8, 64}})
    for (const std::vector<int64_t>& counts : batches) {
      const int rows = int(counts.size());
      const int64_t n_max = *std::max_element(counts.begin(), counts.end()) + 3;
      std::vector<Inputs> in;
      std::vector<std::unique_ptr<DeviceArray<uint8_t>>> caches;
      std::vector<const uint8_t*> cache_ptrs;
      std::vector<float> q, w;
      std::vector<int64_t> visible;
      for (int r = 0; r < rows; ++r) {
        in.push_back(make_inputs({1, heads, hd, counts[size_t(r)], topk, topk_blocks, block_size}, seed += 11));
        const int64_t seen = std::max<int64_t>(0, counts[size_t(r)] - r);  // some entries not yet visible
        for (int64_t t = seen; t < counts[size_t(r)]; ++t) in.back().scores[size_t(t)] = -INFINITY;
        visible.push_back(seen);
        caches.push_back(std::make_unique<DeviceArray<uint8_t>>(in.back().keys));
        cache_ptrs.push_back(caches.back()->get());
        q.insert(q.end(), in.back().q.begin(), in.back().q.end());
        w.insert(w.end(), in.back().w.begin(), in.back().w.end());
      }
      DeviceArray<float> dq(q), dw(w), dscores(size_t(rows) * n_max);
      DeviceArray<const uint8_t*> dcaches(cache_ptrs);
      DeviceArray<int64_t> dn(counts), dvisible(visible);
      DeviceArray<int32_t> dpos(size_t(rows) * topk);
      DeviceArray<uint8_t> dmask(size_t(rows) * n_max);
      dscores.poison();
      dpos.poison();
      cuda::index_scores(dq.get(), dw.get(), rows, heads, hd, dcaches.get(), dn.get(), n_max, dvisible.get(), dscores.get());
      const std::vector<float> scores = dscores.download();
      cuda::top_positions(dscores.get(), rows, dn.get(), n_max, topk, dpos.get());
      cuda::candidate_mask(dscores.get(), rows, dn.get(), n_max, dvisible.get(), topk_blocks, block_size, dmask.get());
      const std::vector<int32_t> pos = dpos.download();
      const std::vector<uint8_t> mask = dmask.download();
      size_t bad_scores = 0, bad_rows = 0;
      for (int r = 0; r < rows; ++r) {
        const int64_t n = counts[size_t(r)];
        const std::vector<float> got(scores.begin() + r * n_max, scores.begin() + r * n_max + n);
        bad_scores += bit_mismatches(got, in[size_t(r)].scores);
        std::vector<int32_t> want_pos;
        std::vector<uint8_t> want_mask;
        cpu_select(in[size_t(r)].scores, 1, n, topk, {visible[size_t(r)]}, topk_blocks, block_size, want_pos, want_mask);
        bad_rows += !std::equal(want_pos.begin(), want_pos.end(), pos.begin() + r * topk) ||
                    !std::equal(want_mask.begin(), want_mask.end(), mask.begin() + r * n_max);
      }
      std::printf("rows over their own caches, %d heads x %d, %d rows up to n=%lld: %zu scores differ, %zu rows' "
                  "positions or masks differ\n", heads, hd, rows, (long long)(n_max - 3), bad_scores, bad_rows);
      EXPECT_EQ(bad_scores, 0u) << heads << " heads, n_max " << n_max;
      EXPECT_EQ(bad_rows, 0u) << heads << " heads, n_max " << n_max;
    }
}

// The host-n and device-n forms on the same scores; the device form's rows n_max apart.
TEST(CudaIndexer, LongContextTopPositionsAndCandidateBlocksMatchTheCpu) {
  DSV41_REQUIRE_DEVICE();
  const int topk_blocks = 2048, block_size = 8;
  const LongCase cases[] = {
      {1, 262144, 0, Shape::Normal, 512},        {1, 262144, 1000, Shape::FewLevels, 512},
      {1, 262144, 200000, Shape::Normal, 1024},  {1, 1048576, 0, Shape::Normal, 512},
      {1, 1048576, 7777, Shape::FewLevels, 512}, {1, 1048576, 3, Shape::AllTied, 1024},
      {1, 1048576, 1048000, Shape::Normal, 512},  // fewer visible than k: -inf chosen, then tail
      {3, 100003, 51, Shape::FewLevels, 512},    {2, 40000, 0, Shape::Normal, 600},
  };
  uint32_t seed = 1234;
  for (const LongCase& c : cases) {
    const std::vector<float> s = synthetic_scores(c.rows, c.n, c.shape, c.masked, seed += 7);
    const std::vector<int64_t> len(size_t(c.rows), c.n - c.masked);
    std::vector<int32_t> want_pos;
    std::vector<uint8_t> want_mask;
    cpu_select(s, c.rows, c.n, c.topk, len, topk_blocks, block_size, want_pos, want_mask);

    // Host n.
    DeviceArray<float> dscores(s);
    DeviceArray<int64_t> dlen(len), dn(std::vector<int64_t>(size_t(c.rows), c.n));
    DeviceArray<int32_t> dpos(want_pos.size());
    DeviceArray<uint8_t> dmask(want_mask.size());
    dpos.poison();
    dmask.poison();
    cuda::top_positions(dscores.get(), c.rows, c.n, c.topk, dpos.get());
    cuda::candidate_mask(dscores.get(), c.rows, c.n, dlen.get(), topk_blocks, block_size, dmask.get());
    const bool pos_ok = dpos.download() == want_pos, mask_ok = dmask.download() == want_mask;

    // Device n, rows n_max apart (n_max past n changes the grid: another slicing of the rows).
    const int64_t n_max = c.n + 12345;
    std::vector<float> wide(size_t(c.rows) * n_max, 1e30f);  // past n: ignored
    for (int r = 0; r < c.rows; ++r) std::copy_n(s.begin() + size_t(r) * c.n, c.n, wide.begin() + size_t(r) * n_max);
    DeviceArray<float> dwide(wide);
    DeviceArray<uint8_t> dwide_mask(size_t(c.rows) * n_max);
    dpos.poison();
    dwide_mask.poison();
    cuda::top_positions(dwide.get(), c.rows, dn.get(), n_max, c.topk, dpos.get());
    cuda::candidate_mask(dwide.get(), c.rows, dn.get(), n_max, dlen.get(), topk_blocks, block_size, dwide_mask.get());
    const std::vector<uint8_t> wide_mask = dwide_mask.download();
    std::vector<uint8_t> got_mask;
    size_t untouched = 0;
    for (int r = 0; r < c.rows; ++r) {
      got_mask.insert(got_mask.end(), wide_mask.begin() + size_t(r) * n_max, wide_mask.begin() + size_t(r) * n_max + c.n);
      for (int64_t t = c.n; t < n_max; ++t) untouched += wide_mask[size_t(r) * n_max + t] == 0xFF;
    }
    const bool dev_pos_ok = dpos.download() == want_pos, dev_mask_ok = got_mask == want_mask;
    size_t selected = 0;
    for (uint8_t m : want_mask) selected += m;
    std::printf("long top_positions k=%d + candidate_mask, rows=%d n=%lld (%s, %lld masked): host n %s/%s, device n %s/%s"
                " (%zu positions in the masks)\n",
                c.topk, c.rows, (long long)c.n, shape_name(c.shape), (long long)c.masked, pos_ok ? "ok" : "DIFFER",
                mask_ok ? "ok" : "DIFFER", dev_pos_ok ? "ok" : "DIFFER", dev_mask_ok ? "ok" : "DIFFER", selected);
    EXPECT_TRUE(pos_ok && mask_ok && dev_pos_ok && dev_mask_ok) << "n=" << c.n << " " << shape_name(c.shape);
    EXPECT_EQ(untouched, size_t(c.rows) * (n_max - c.n)) << "the mask past n is left as it was";
  }
}

// One capture of the device-n ops at n_max = 1M, replayed as n grows (the small n runs on the
// many-block layout too, with most blocks idle): each replay equals the CPU.
TEST(CudaIndexer, DeviceCountSelectionReplaysInAGraphAsNGrows) {
  DSV41_REQUIRE_DEVICE();
  const int64_t n_max = 1 << 20;
  const int topk = 512, topk_blocks = 2048, block_size = 8;
  const std::vector<float> s = synthetic_scores(1, n_max, Shape::Normal, 0, 77);
  DeviceArray<float> dscores(s);
  DeviceArray<int64_t> dn(std::vector<int64_t>{n_max}), dlen(std::vector<int64_t>{n_max});
  DeviceArray<int32_t> dpos(topk);
  DeviceArray<uint8_t> dmask{size_t(n_max)};
  cudaStream_t stream;
  cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  auto step = [&] {
    cuda::top_positions(dscores.get(), 1, dn.get(), n_max, topk, dpos.get(), stream);
    cuda::candidate_mask(dscores.get(), 1, dn.get(), n_max, dlen.get(), topk_blocks, block_size, dmask.get(), stream);
  };
  step();  // warm-up: the scratch pool is set up outside the capture
  cuda::check(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cuda::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  step();
  cuda::check(cudaStreamEndCapture(stream, &graph), "capture");
  cuda::check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  for (const int64_t n : {int64_t(300), int64_t(5000), int64_t(300001), n_max}) {
    const int64_t visible = n - n / 7;  // the newest entries of the cache not yet visible to the query
    std::vector<float> row(s.begin(), s.begin() + n);
    for (int64_t t = visible; t < n; ++t) row[size_t(t)] = -INFINITY;
    cuda::check(cudaMemcpy(dscores.get(), row.data(), size_t(n) * 4, cudaMemcpyHostToDevice), "upload");
    dn.upload({n});
    dlen.upload({visible});
    dpos.poison();
    dmask.poison();
    cuda::check(cudaDeviceSynchronize(), "uploads");  // the legacy stream's copies and memsets, before the replay
    cuda::check(cudaGraphLaunch(exec, stream), "replay");
    cuda::check(cudaStreamSynchronize(stream), "replay");
    std::vector<int32_t> want_pos;
    std::vector<uint8_t> want_mask;
    cpu_select(row, 1, n, topk, {visible}, topk_blocks, block_size, want_pos, want_mask);
    const std::vector<uint8_t> mask = dmask.download();
    const bool pos_ok = dpos.download() == want_pos;
    const bool mask_ok = std::equal(want_mask.begin(), want_mask.end(), mask.begin());
    std::printf("graph replay at n=%lld of n_max=%lld: positions %s, mask %s\n", (long long)n, (long long)n_max,
                pos_ok ? "ok" : "DIFFER", mask_ok ? "ok" : "DIFFER");
    EXPECT_TRUE(pos_ok && mask_ok) << "n=" << n;
  }
  cudaGraphExecDestroy(exec), cudaGraphDestroy(graph), cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace dsv41
