#include "forward/sequence_mark.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "numerics/codecs.h"

namespace dsv41 {

namespace {

// The ring slots of positions length .. length + n − 1, n = min(rows, W), in that order.
std::vector<int64_t> marked_slots(const Config& c, int64_t length, int64_t rows) {
  std::vector<int64_t> slots;
  for (int64_t pos = length; pos < length + std::min<int64_t>(rows, c.window_size); ++pos) slots.push_back(pos % c.window_size);
  return slots;
}

}  // namespace

SequenceMark mark(const SequenceState& state, const Config& c, int64_t rows) {
  if (rows < 1) fail("mark", "a call of at least one row", std::to_string(rows));
  SequenceMark m;
  m.length = state.length, m.rows = rows;
  m.decoder_window_floor = state.decoder_window_floor, m.encoder_window_floor = state.encoder_window_floor;
  const size_t slot = swa_fp8::bytes(c.head_dim);
  const std::vector<int64_t> slots = marked_slots(c, state.length, rows);
  for (const std::vector<uint8_t>& ring : state.window) {
    std::vector<uint8_t>& saved = m.slots.emplace_back();
    for (int64_t s : slots) saved.insert(saved.end(), ring.begin() + s * int64_t(slot), ring.begin() + (s + 1) * int64_t(slot));
  }
  for (const auto& [layer, cache] : state.compressed)
    m.compressed[layer] = {cache.entries, cache.kv.size(), cache.index_k.size(), cache.pending, cache.pending_kv, cache.pending_score};
  return m;
}

void rewind(SequenceState& state, const Config& c, const SequenceMark& m) {
  if (state.length < m.length || state.length > m.length + m.rows || state.window.size() != m.slots.size())
    fail("rewind", "a state at most " + std::to_string(m.rows) + " positions past its mark at " + std::to_string(m.length),
         "one of " + std::to_string(state.length) + " positions");
  const size_t slot = swa_fp8::bytes(c.head_dim);
  const std::vector<int64_t> slots = marked_slots(c, m.length, m.rows);
  for (size_t r = 0; r < state.window.size(); ++r)
    for (size_t i = 0; i < slots.size(); ++i)
      std::copy_n(m.slots[r].begin() + int64_t(i * slot), slot, state.window[r].begin() + slots[i] * int64_t(slot));
  for (auto& [layer, cache] : state.compressed) {
    const SequenceMark::Compressed& saved = m.compressed.at(layer);
    cache.entries = saved.entries;
    cache.kv.resize(saved.kv_bytes);
    cache.index_k.resize(saved.index_bytes);
    cache.pending = saved.pending;
    cache.pending_kv = saved.pending_kv;
    cache.pending_score = saved.pending_score;
  }
  state.length = m.length;
  state.decoder_window_floor = m.decoder_window_floor;
  state.encoder_window_floor = m.encoder_window_floor;
}

}  // namespace dsv41
