#pragma once
// Undoing a forward call: what a call of `rows` tokens may change in a sequence's state, saved
// before it, so that the state can be put back exactly (speculative decoding's rejected positions,
// forward/dspark.h). A call appends at the end of the state and changes nothing before it except
// the ring slots its positions overwrite (slot = position mod W) and each compressor's open group:
//  * the counters (length, window floors);
//  * per ring (DSpark's stages' included), the bytes of the min(rows, W) slots the call writes;
//  * per kv-source, its entry count and bytes (the call only appends), and its open group's rows.
#include <cstdint>
#include <map>
#include <vector>

#include "forward/sequence_state.h"

namespace dsv41 {

struct SequenceMark {
  int64_t length = 0, decoder_window_floor = 0, encoder_window_floor = 0, rows = 0;
  std::vector<std::vector<uint8_t>> slots;  // per ring: its slots for positions length .. (in that order)
  struct Compressed {
    int64_t entries = 0;
    size_t kv_bytes = 0, index_bytes = 0;
    int pending = 0;
    std::vector<float> pending_kv, pending_score;
  };
  std::map<int, Compressed> compressed;
};

// Saves what a call of `rows` tokens at the end of `state` may change.
SequenceMark mark(const SequenceState& state, const Config& config, int64_t rows);

// Puts the state back as it was at the mark, after at most the marked rows ran (a call of more
// rows, or a state that does not continue the mark, is refused by name).
void rewind(SequenceState& state, const Config& config, const SequenceMark& mark);

}  // namespace dsv41
