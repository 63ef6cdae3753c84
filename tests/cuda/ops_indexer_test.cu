// cuda::index_scores, cuda::top_positions and cuda::candidate_mask against the CPU indexer
// (backend/cpu/indexer.h) on the same random inputs: the V4.1-Flash shape (32 heads × 128, top-k
// 512, candidate blocks 2048 of 8) at a 65K-entry cache, and small odd shapes (hd 32 and 64, one
// head, n below a block of keys, k > n).
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
#include <random>
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

}  // namespace
}  // namespace dsv41
