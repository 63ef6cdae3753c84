#pragma once
// Two sequence states hold the same KV: every counter, ring, entry and open row, byte for byte
// (the open groups' buffers past their rows are stale, and not compared).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "forward/sequence_state.h"

namespace dsv41::test {

inline void expect_same_state(const Config& c, const SequenceState& a, const SequenceState& b, const std::string& what) {
  EXPECT_EQ(a.length, b.length) << what;
  EXPECT_EQ(a.decoder_window_floor, b.decoder_window_floor) << what;
  EXPECT_EQ(a.encoder_window_floor, b.encoder_window_floor) << what;
  ASSERT_EQ(a.window.size(), b.window.size()) << what;
  for (size_t l = 0; l < a.window.size(); ++l) EXPECT_TRUE(a.window[l] == b.window[l]) << what << ": ring " << l;
  ASSERT_EQ(a.compressed.size(), b.compressed.size()) << what;
  for (const auto& [layer, x] : a.compressed) {
    const CompressedCache& y = b.compressed.at(layer);
    EXPECT_EQ(x.entries, y.entries) << what << ": layer " << layer;
    EXPECT_TRUE(x.kv == y.kv) << what << ": layer " << layer;
    EXPECT_TRUE(x.index_k == y.index_k) << what << ": layer " << layer;
    ASSERT_EQ(x.pending, y.pending) << what << ": layer " << layer;
    const size_t open = size_t(x.pending) * size_t(c.head_dim);
    ASSERT_GE(x.pending_kv.size(), open) << what << ": layer " << layer;
    ASSERT_GE(y.pending_kv.size(), open) << what << ": layer " << layer;
    ASSERT_GE(x.pending_score.size(), open) << what << ": layer " << layer;
    ASSERT_GE(y.pending_score.size(), open) << what << ": layer " << layer;
    EXPECT_TRUE(std::equal(x.pending_kv.begin(), x.pending_kv.begin() + open, y.pending_kv.begin())) << what << ": layer " << layer;
    EXPECT_TRUE(std::equal(x.pending_score.begin(), x.pending_score.begin() + open, y.pending_score.begin()))
        << what << ": layer " << layer;
  }
}

}  // namespace dsv41::test
