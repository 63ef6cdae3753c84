#pragma once
// The entry lists of DSpark's attention in training (forward.cpp attend_draft; docs/training.md,
// "DSpark"), shared by the CPU trainer's op set (train_ops.h) and the CUDA trainer's: each row of
// block b attends to its stage's window of context KV before its anchor a — positions
// max(0, a − W) .. a − 1 in the ring's slot order (slot = position mod W), empty slots −1, and under
// bounded replay none below the decoder window floor at the draft's time (forward/window.h
// draft_window_slots: the floor of the call that ran row a − 1) — then to every row of its block.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "forward/window.h"

namespace dsv41::train {

// idx [blocks · G, W + G]: rows of a table that holds the context KV's rows (the positions
// `context_positions`, in that order) and then the blocks' own G rows each. `floors` by position
// (empty: exact mode, floor 0); `length`: the target's rows (positions 0 .. length − 1).
inline std::vector<int64_t> draft_attention_lists(std::span<const int64_t> anchors, int64_t G, int64_t W,
                                                  std::span<const int64_t> floors, std::span<const int64_t> context_positions,
                                                  int64_t length) {
  const int64_t L = int64_t(context_positions.size());
  std::vector<int64_t> context_row(size_t(length), -1);  // by position
  for (int64_t r = 0; r < L; ++r) context_row[size_t(context_positions[size_t(r)])] = r;
  std::vector<int64_t> idx, slots;
  idx.reserve(anchors.size() * size_t(G * (W + G)));
  for (size_t b = 0; b < anchors.size(); ++b) {
    const int64_t a = anchors[b];
    for (int64_t j = 0; j < G; ++j) {
      draft_window_slots(a, W, floors.empty() ? 0 : floors[size_t(a - 1)], slots);
      for (int64_t s : slots) {
        if (s == kEmptySlot) {
          idx.push_back(-1);
          continue;
        }
        const int64_t position = a <= W ? s : a - W + ((s - a % W) % W + W) % W;  // the ring's slot s
        if (context_row[size_t(position)] < 0)
          fail("train forward", "a draft window of rows the decoder ran",
               "position " + std::to_string(position) + " before anchor " + std::to_string(a) + ", cut above the floor");
        idx.push_back(context_row[size_t(position)]);
      }
      for (int64_t s = int64_t(slots.size()); s < W; ++s) idx.push_back(-1);
      for (int64_t k = 0; k < G; ++k) idx.push_back(L + int64_t(b) * G + k);
    }
  }
  return idx;
}

}  // namespace dsv41::train
