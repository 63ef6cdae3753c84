#pragma once
// Every executor restores a sequence from the KV tiers' pieces (Sequence::restore, a StateView)
// into exactly the state materialize() makes of them on the host — whatever the sequence held
// before, with the rings zeroed on an SWA miss — refuses a torn view without touching what it
// holds, and saves for the tiers what it holds. Run for the CPU executor (kv_restore_test) and
// the CUDA one (tests/cuda).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "forward/executor.h"
#include "numerics/codecs.h"
#include "same_state.h"

namespace dsv41::test {

// A state of `length` tokens holding global KV for `held` tokens (past its length, as an encoder
// replay's restore holds it), random bytes everywhere, an open group in every layer that has
// groups.
inline SequenceState random_state(const Config& c, int64_t length, int64_t held, uint32_t seed) {
  std::mt19937 rng(seed);
  auto fill = [&](std::vector<uint8_t>& v) {
    for (uint8_t& b : v) b = uint8_t(rng());
  };
  SequenceState s(c);
  s.length = length;
  s.decoder_window_floor = length / 3;
  s.encoder_window_floor = length / 5;
  for (auto& ring : s.window) fill(ring);
  for (auto& [layer, cache] : s.compressed) {
    const int ratio = c.compress_ratios[size_t(layer)];
    cache.entries = held / ratio;
    cache.kv.resize(size_t(cache.entries) * kv_fp4::bytes(c.head_dim));
    cache.index_k.resize(size_t(cache.entries) * mxfp4::bytes(c.index_head_dim));
    fill(cache.kv), fill(cache.index_k);
    if (ratio > 1) {
      cache.pending = 1;
      cache.pending_kv.resize(size_t(ratio) * size_t(c.head_dim));
      cache.pending_score.resize(size_t(ratio) * size_t(c.head_dim));
      for (float& x : cache.pending_kv) x = float(rng() % 1000) / 7.0f;
      for (float& x : cache.pending_score) x = float(rng() % 1000) / 9.0f;
    }
  }
  return s;
}

// A view of `s` with each cache cut into pieces of at most `piece` bytes (as the tiers' blocks
// cut it), the rings left out when `window` is false (an SWA miss).
inline StateView pieces_of(const SequenceState& s, size_t piece, bool window) {
  StateView v = view_of(s);
  auto cut = [&](std::vector<Bytes>& pieces) {
    std::vector<Bytes> out;
    for (Bytes p : pieces)
      for (size_t at = 0; at < p.size(); at += piece) out.push_back(p.subspan(at, std::min(piece, p.size() - at)));
    pieces = std::move(out);
  };
  for (auto& [layer, cache] : v.compressed) cut(cache.kv), cut(cache.index_k);
  if (!window) v.window.clear();
  return v;
}

inline void expect_restores_as_the_host(const Config& c, Executor& executor) {
  std::unique_ptr<Sequence> sequence = executor.new_sequence();
  sequence->assign(random_state(c, 300, 300, 1));  // something to overwrite

  // Past the CUDA executor's first capacity (4,096 tokens), in pieces of odd sizes.
  const SequenceState s = random_state(c, 100, 9000, 2);
  sequence->restore(pieces_of(s, 1000, true));
  expect_same_state(c, sequence->host(), s, executor.name() + ": an SWA hit's restore");
  EXPECT_EQ(sequence->length(), 100);

  // An SWA miss: the global KV alone, every ring zero.
  StateView miss = pieces_of(s, 777, false);
  miss.length = 64;
  sequence->restore(miss);
  SequenceState zeros = s;
  zeros.length = 64;
  for (auto& ring : zeros.window) std::fill(ring.begin(), ring.end(), uint8_t(0));
  expect_same_state(c, sequence->host(), zeros, executor.name() + ": an SWA miss's restore");

  // Torn views are refused by name and change nothing.
  StateView short_kv = pieces_of(s, 1000, true);
  short_kv.compressed.begin()->second.kv.pop_back();
  EXPECT_THROW(sequence->restore(short_kv), Error);
  StateView few_rings = pieces_of(s, 1000, true);
  few_rings.window.pop_back();
  EXPECT_THROW(sequence->restore(few_rings), Error);
  expect_same_state(c, sequence->host(), zeros, executor.name() + ": after the refused restores");

  // What the tiers save: the counters, rings and open groups, and the global KV from the entries
  // of the token asked for on (at most from there; the CPU's view is the whole state).
  sequence->restore(view_of(s));
  for (int64_t from : {int64_t(0), int64_t(4096), int64_t(9000), int64_t(20000)}) {
    const std::string what = executor.name() + ": saved from token " + std::to_string(from);
    const StateView v = sequence->saved(from);
    EXPECT_EQ(v.length, s.length) << what;
    EXPECT_EQ(v.decoder_window_floor, s.decoder_window_floor) << what;
    EXPECT_EQ(v.encoder_window_floor, s.encoder_window_floor) << what;
    ASSERT_EQ(v.window.size(), s.window.size()) << what;
    for (size_t l = 0; l < s.window.size(); ++l)
      EXPECT_TRUE(std::equal(v.window[l].begin(), v.window[l].end(), s.window[l].begin(), s.window[l].end())) << what << ": ring " << l;
    for (const auto& [layer, h] : s.compressed) {
      const StateView::Compressed& got = v.compressed.at(layer);
      const int ratio = c.compress_ratios[size_t(layer)];
      EXPECT_EQ(got.entries, h.entries) << what;
      EXPECT_LE(got.first, std::min(h.entries, from / ratio)) << what;
      const size_t eb = kv_fp4::bytes(c.head_dim), kb = mxfp4::bytes(c.index_head_dim);
      std::vector<uint8_t> kv, keys;
      append_bytes(kv, got.kv, 0, size_t(h.entries - got.first) * eb);
      append_bytes(keys, got.index_k, 0, size_t(h.entries - got.first) * kb);
      EXPECT_TRUE(std::equal(kv.begin(), kv.end(), h.kv.begin() + got.first * int64_t(eb), h.kv.end())) << what << ": layer " << layer;
      EXPECT_TRUE(std::equal(keys.begin(), keys.end(), h.index_k.begin() + got.first * int64_t(kb), h.index_k.end()))
          << what << ": layer " << layer;
      EXPECT_EQ(got.pending, h.pending) << what;
      const size_t open = size_t(h.pending) * size_t(c.head_dim) * sizeof(float);
      ASSERT_GE(got.pending_kv.size(), open) << what;
      ASSERT_GE(got.pending_score.size(), open) << what;
      EXPECT_EQ(std::memcmp(got.pending_kv.data(), h.pending_kv.data(), open), 0) << what << ": layer " << layer;
      EXPECT_EQ(std::memcmp(got.pending_score.data(), h.pending_score.data(), open), 0) << what << ": layer " << layer;
    }
  }
}

}  // namespace dsv41::test
