// The compressor's kernels (cuda::pool_groups, cuda::append_pool, cuda::kv_fp4_encode,
// cuda::mxfp4_encode, each encoder to one array and to listed destinations), the
// sliding window's encoder (cuda::swa_fp8_encode) and
// Engram's (cuda::engram_gather, cuda::engram_gate) against the CPU ops and codecs on the same
// random inputs, at V4.1-Flash shapes (head dim 512 pooled over m = 2 and 4, index keys of 128,
// Engram rows of 256 × 24 columns into 4 streams of 5120) and small odd ones.
//
// Tolerances. Encoders and the gather: none, the bytes / values must be identical (the same
// scalar codec functions, the same fp32 divisions). pool_groups keeps the CPU's loops and order;
// only expf may differ in its last bit (CUDA: ≤ 2 ulp), so each softmax weight moves by a few fp32
// units: NMSE ~ (4·2^-24)² ≈ 6e-14, bound 1e-11 (room for outputs that nearly cancel). Rounded
// to bf16 as the forward does, an output near a rounding boundary moves one bf16 unit (2^-8
// relative) instead: with ~1e-5 of them, NMSE ~ 1e-5 · 2^-16 ≈ 2e-10, bound 1e-7. engram_gate:
// its three sums over d run in another order (relative ~1e-7 on the gate), and the update is
// rounded to bf16: the same flips, bound 1e-7; a wrong norm or gate gives NMSE > 1e-4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "../ops_util.h"
#include "backend/cpu/compressor.h"
#include "backend/cpu/engram.h"
#include "backend/cuda/compressor.h"
#include "backend/cuda/engram.h"
#include "device_util.h"
#include "numerics/codecs.h"

namespace dsv41 {
namespace {

using test::DeviceArray;

size_t byte_mismatches(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t bad = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) bad += a[i] != b[i];
  return bad;
}

TEST(CudaCompressor, PoolingMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 10;
  struct Case {
    int groups, m, d;
  };
  for (const Case c : {Case{64, 2, 512}, Case{9, 4, 512}, Case{5, 1, 96}, Case{3, 7, 40}})
    for (bool round : {false, true}) {
      const size_t n = size_t(c.groups) * c.m * c.d;
      const std::vector<float> kv = test::bf16_normal(n, 1.0, seed += 3), score = test::bf16_normal(n, 2.0, seed + 1);
      std::vector<float> want(size_t(c.groups) * c.d);
      for (int g = 0; g < c.groups; ++g) {
        pool_group(kv.data() + size_t(g) * c.m * c.d, score.data() + size_t(g) * c.m * c.d, c.m, c.d,
                   want.data() + size_t(g) * c.d);
        if (round)
          for (int i = 0; i < c.d; ++i) want[size_t(g) * c.d + i] = round_bf16(want[size_t(g) * c.d + i]);
      }
      DeviceArray<float> dkv(kv), dscore(score), dout(want.size());
      dout.poison();
      cuda::pool_groups(dkv.get(), dscore.get(), c.groups, c.m, c.d, round, dout.get());
      const double e = test::nmse(dout.download(), want);
      std::printf("pool_groups %d groups m=%d d=%d round=%d NMSE %.3g\n", c.groups, c.m, c.d, int(round), e);
      EXPECT_LT(e, round ? 1e-7 : 1e-11) << "m=" << c.m << " d=" << c.d;
    }
}

// A decode step's append and pool: each sequence's new row joins its open group, and the groups it
// completes are pooled as pool_groups pools them (the same device function); the other sequences'
// outputs are 0 and their groups hold the new row after the old ones.
TEST(CudaCompressor, AppendPoolClosesCompleteGroups) {
  DSV41_REQUIRE_DEVICE();
  const int m = 4, d = 512, B = 6;
  const std::vector<int32_t> open_rows = {0, 3, 1, 3, 2, 0};
  const std::vector<float> kv = test::bf16_normal(size_t(B) * d, 1.0, 71), score = test::bf16_normal(size_t(B) * d, 2.0, 72);
  std::vector<std::vector<float>> open_kv, open_score;
  std::vector<float*> kv_ptr, score_ptr;
  std::vector<std::unique_ptr<DeviceArray<float>>> owned;
  for (int b = 0; b < B; ++b) {
    open_kv.push_back(test::bf16_normal(size_t(m) * d, 1.0, 80 + b));
    open_score.push_back(test::bf16_normal(size_t(m) * d, 2.0, 90 + b));
    owned.push_back(std::make_unique<DeviceArray<float>>(open_kv.back()));
    kv_ptr.push_back(owned.back()->get());
    owned.push_back(std::make_unique<DeviceArray<float>>(open_score.back()));
    score_ptr.push_back(owned.back()->get());
  }
  std::vector<float> want(size_t(B) * d, 0.0f);
  for (int b = 0; b < B; ++b) {
    const size_t at = size_t(open_rows[size_t(b)]) * d;
    std::copy_n(kv.begin() + b * d, d, open_kv[size_t(b)].begin() + at);
    std::copy_n(score.begin() + b * d, d, open_score[size_t(b)].begin() + at);
    if (open_rows[size_t(b)] + 1 == m) {
      pool_group(open_kv[size_t(b)].data(), open_score[size_t(b)].data(), m, d, want.data() + size_t(b) * d);
      for (int i = 0; i < d; ++i) want[size_t(b) * d + i] = round_bf16(want[size_t(b) * d + i]);
    }
  }
  DeviceArray<float> dkv(kv), dscore(score), dout(want.size());
  DeviceArray<float*> dkv_ptr(kv_ptr), dscore_ptr(score_ptr);
  DeviceArray<int32_t> drows(open_rows);
  dout.poison();
  cuda::append_pool(dkv.get(), dscore.get(), B, dkv_ptr.get(), dscore_ptr.get(), drows.get(), m, d, true, dout.get());
  const double e = test::nmse(dout.download(), want);
  std::printf("append_pool %d sequences m=%d d=%d NMSE %.3g\n", B, m, d, e);
  EXPECT_LT(e, 1e-7);  // pool_groups' bound with rounding (the header's reasoning)
  for (int b = 0; b < B; ++b) {
    EXPECT_EQ(owned[size_t(2 * b)]->download(), open_kv[size_t(b)]) << "open kv of sequence " << b;
    EXPECT_EQ(owned[size_t(2 * b + 1)]->download(), open_score[size_t(b)]) << "open score of sequence " << b;
  }
}

// Rows of normal values with some all-zero blocks and some huge ones (KV-FP4's e4m3 scale saturates
// above 6·448) and tiny ones (the scale floors).
std::vector<float> codec_input(int entries, int d, uint32_t seed) {
  std::vector<float> x = test::bf16_normal(size_t(entries) * d, 1.0, seed);
  for (int e = 0; e < entries; e += 7)
    for (int i = 0; i < 32 && i < d; ++i) x[size_t(e) * d + i] = 0;
  for (int e = 3; e < entries; e += 11) x[size_t(e) * d + d - 1] = 5000.0f;
  for (int e = 5; e < entries; e += 13)
    for (int i = 0; i < d; ++i) x[size_t(e) * d + i] *= 0x1p-20f;
  return x;
}

TEST(CudaCompressor, CacheEncodersAreTheCodecsBitForBit) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 50;
  struct Case {
    int entries, d;
  };
  for (const Case c : {Case{1000, 512}, Case{37, 64}}) {
    const std::vector<float> x = codec_input(c.entries, c.d, seed += 7);
    std::vector<uint8_t> want(size_t(c.entries) * kv_fp4::bytes(c.d));
    for (int e = 0; e < c.entries; ++e) kv_fp4::encode(x.data() + size_t(e) * c.d, c.d, want.data() + e * kv_fp4::bytes(c.d));
    DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dout(want.size());
    dout.poison();
    cuda::kv_fp4_encode(dx.get(), c.entries, c.d, dout.get());
    const size_t bad = byte_mismatches(dout.download(), want);
    std::printf("kv_fp4_encode %d × %d: %zu of %zu bytes differ\n", c.entries, c.d, bad, want.size());
    EXPECT_EQ(bad, 0u);
  }
  for (const Case c : {Case{1000, 128}, Case{29, 32}, Case{5, 512}}) {
    const std::vector<float> x = codec_input(c.entries, c.d, seed += 7);
    std::vector<uint8_t> want(size_t(c.entries) * mxfp4::bytes(c.d));
    for (int e = 0; e < c.entries; ++e) mxfp4::encode(x.data() + size_t(e) * c.d, c.d, want.data() + e * mxfp4::bytes(c.d));
    DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dout(want.size());
    dout.poison();
    cuda::mxfp4_encode(dx.get(), c.entries, c.d, dout.get());
    const size_t bad = byte_mismatches(dout.download(), want);
    std::printf("mxfp4_encode %d × %d: %zu of %zu bytes differ\n", c.entries, c.d, bad, want.size());
    EXPECT_EQ(bad, 0u);
  }
  // Listed destinations: entry e to slot entries - 1 - e, every third entry to none (its slot keeps
  // the poison bytes).
  for (const int d : {512, 128}) {
    const int entries = 31;
    const std::vector<float> x = codec_input(entries, d, seed += 7);
    const bool kv = d == 512;
    const size_t bytes = kv ? kv_fp4::bytes(d) : mxfp4::bytes(d);
    std::vector<uint8_t> want(size_t(entries) * bytes, 0xFF);
    DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dout(want.size());
    dout.poison();
    std::vector<uint8_t*> slots;
    for (int e = 0; e < entries; ++e) {
      uint8_t* w = want.data() + (entries - 1 - e) * bytes;
      if (e % 3 == 2) {
        slots.push_back(nullptr);
        continue;
      }
      slots.push_back(dout.get() + (entries - 1 - e) * bytes);
      if (kv) kv_fp4::encode(x.data() + size_t(e) * d, d, w);
      else mxfp4::encode(x.data() + size_t(e) * d, d, w);
    }
    DeviceArray<uint8_t*> dslots(slots);
    if (kv) cuda::kv_fp4_encode(dx.get(), entries, d, dslots.get());
    else cuda::mxfp4_encode(dx.get(), entries, d, dslots.get());
    const size_t bad = byte_mismatches(dout.download(), want);
    std::printf("%s listed %d × %d: %zu of %zu bytes differ\n", kv ? "kv_fp4_encode" : "mxfp4_encode", entries, d, bad,
                want.size());
    EXPECT_EQ(bad, 0u);
  }
  // SWA-FP8, each entry to its own slot: here entry e to slot entries - 1 - e, as a ring scatters.
  for (const Case c : {Case{300, 512}, Case{7, 64}}) {
    const std::vector<float> x = codec_input(c.entries, c.d, seed += 7);
    const size_t bytes = swa_fp8::bytes(c.d);
    std::vector<uint8_t> want(size_t(c.entries) * bytes);
    for (int e = 0; e < c.entries; ++e) swa_fp8::encode(x.data() + size_t(e) * c.d, c.d, want.data() + (c.entries - 1 - e) * bytes);
    DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dout(want.size());
    dout.poison();
    std::vector<uint8_t*> slots;
    for (int e = 0; e < c.entries; ++e) slots.push_back(dout.get() + (c.entries - 1 - e) * bytes);
    DeviceArray<uint8_t*> dslots(slots);
    cuda::swa_fp8_encode(dx.get(), c.entries, c.d, dslots.get());
    const size_t bad = byte_mismatches(dout.download(), want);
    std::printf("swa_fp8_encode %d × %d: %zu of %zu bytes differ\n", c.entries, c.d, bad, want.size());
    EXPECT_EQ(bad, 0u);
  }
}

TEST(CudaEngram, GatherIsTheCpuGatherBitForBit) {
  DSV41_REQUIRE_DEVICE();
  const int64_t table_rows = 5000;
  for (const int hd : {256, 32}) {
    const int rows = 3, cols = 24;
    std::mt19937 rng{uint32_t(hd)};
    std::vector<uint8_t> table(size_t(table_rows * hd)), scales(size_t(table_rows * hd / 32));
    for (auto& b : table) b = uint8_t(rng() % 0x7F) | uint8_t(rng() & 0x80);  // every code but NaN
    for (auto& s : scales) s = uint8_t(117 + rng() % 20);
    std::vector<int64_t> ids(size_t(rows) * cols);
    for (auto& i : ids) i = int64_t(rng() % table_rows);
    std::vector<float> want(size_t(rows) * cols * hd);
    for (int r = 0; r < rows; ++r) engram_gather(table.data(), scales.data(), hd, ids.data() + r * cols, cols, want.data() + size_t(r) * cols * hd);
    DeviceArray<uint8_t> dtable(table), dscales(scales);
    DeviceArray<int64_t> dids(ids);
    DeviceArray<float> dout(want.size());
    dout.poison();
    cuda::engram_gather(dtable.get(), dscales.get(), hd, dids.get(), rows, cols, dout.get());
    const std::vector<float> got = dout.download();
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i) bad += got[i] != want[i];
    std::printf("engram_gather hd=%d %d × %d: %zu of %zu differ\n", hd, rows, cols, bad, got.size());
    EXPECT_EQ(bad, 0u);
  }
}

TEST(CudaEngram, GateMatchesCpu) {
  DSV41_REQUIRE_DEVICE();
  uint32_t seed = 77;
  struct Case {
    int rows, hc;
    int64_t d;
  };
  for (const Case c : {Case{1, 4, 5120}, Case{6, 4, 5120}, Case{3, 2, 96}}) {
    std::vector<float> X = test::bf16_normal(size_t(c.rows) * c.hc * c.d, 1.0, seed += 5);
    const std::vector<float> kv = test::bf16_normal(size_t(c.rows) * (c.hc + 1) * c.d, 1.0, seed + 1);
    const std::vector<float> qk = test::bf16_normal(size_t(c.hc) * c.d, 1.0, seed + 2);
    DeviceArray<float> dX(X), dkv(kv), dqk(qk);
    const float eps = 1e-20f;
    for (int r = 0; r < c.rows; ++r)
      engram_gate(X.data() + size_t(r) * c.hc * c.d, kv.data() + size_t(r) * (c.hc + 1) * c.d, qk.data(), c.hc, c.d, eps);
    cuda::engram_gate(dX.get(), dkv.get(), dqk.get(), c.rows, c.hc, c.d, eps);
    const double e = test::nmse(dX.download(), X);
    std::printf("engram_gate rows=%d hc=%d d=%lld NMSE %.3g\n", c.rows, c.hc, (long long)c.d, e);
    EXPECT_LT(e, 1e-7);
  }
}

}  // namespace
}  // namespace dsv41
