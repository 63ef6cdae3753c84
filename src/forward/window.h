#pragma once
// The sliding window of one query, as the positions it lists (DESIGN §3): the slot order is the
// reference's, and it matters to the last bit, since the softmax runs online over the list.
//  * In a call that starts at position 0 (a first prefill of `rows` rows), the query at row i
//    lists min(rows, W) slots from max(0, i - W + 1); the slots past i are empty, at the end.
//  * In any later call, it lists the W positions up to its own, oldest first; positions before
//    0 are empty, at the front (the decode ring's order).
// Bounded replay truncates the window at its segment start s = floor: a query at i sees window
// keys in [max(s, i - W + 1), i], positions before s being empty slots.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace dsv41 {

inline constexpr int64_t kEmptySlot = -1;

inline void window_positions(int64_t pos, int64_t call_start, int64_t call_rows, int64_t W, int64_t floor,
                             std::vector<int64_t>& out) {
  out.clear();
  const int64_t lowest = std::max<int64_t>(0, floor);
  if (call_start == 0) {
    const int64_t base = std::max<int64_t>(0, pos - W + 1);
    for (int64_t j = 0; j < std::min(call_rows, W); ++j)
      out.push_back(base + j > pos || base + j < lowest ? kEmptySlot : base + j);
  } else {
    for (int64_t t = pos - W + 1; t <= pos; ++t) out.push_back(t < lowest ? kEmptySlot : t);
  }
}

// The context a DSpark draft block reads from a stage's ring (forward.cpp attend_draft): the slots
// 0 .. min(W, start) − 1 in slot order (the reference's list; `start` is the block's first
// position, one past the last context token), a slot empty where its position is below `floor`:
// the decoder window floor, below which the decoder ran no row, so no context features were
// ingested there (bounded replay; an SWA miss's encoder replay).
inline void draft_window_slots(int64_t start, int64_t W, int64_t floor, std::vector<int64_t>& out) {
  out.clear();
  for (int64_t s = 0; s < std::min(W, start); ++s) {
    const int64_t p = start <= W ? s : start - W + ((s - start) % W + W) % W;  // the ring's last W positions
    out.push_back(p < floor ? kEmptySlot : s);
  }
}

}  // namespace dsv41
