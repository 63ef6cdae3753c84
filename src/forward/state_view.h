#pragma once
// A sequence's state as pieces of other memory — the KV tiers' global blocks and SWA tail — in
// SequenceState's order: what a restore copies, once, into wherever an executor keeps the state
// (a SequenceState on the host; device memory for CUDA, with no host state in between).
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "forward/sequence_state.h"

namespace dsv41 {

using Bytes = std::span<const uint8_t>;

struct StateView {
  int64_t length = 0;
  int64_t decoder_window_floor = 0;
  int64_t encoder_window_floor = 0;
  // Per ring its W slots' bytes; none at all (an SWA miss): every ring zero.
  std::vector<Bytes> window;
  struct Compressed {
    int64_t entries = 0;
    int64_t first = 0;               // the pieces hold entries [first, entries): a state saved in part
    std::vector<Bytes> kv, index_k;  // those entries' bytes, piece after piece
    int pending = 0;
    Bytes pending_kv, pending_score;  // fp32 rows as bytes (a tail's fields are not aligned)
  };
  std::map<int, Compressed> compressed;  // by kv-source layer, every one of the config's
};

// A view of a host state's own memory (valid while it is unchanged).
StateView view_of(const SequenceState& state);

// The viewed state as a host SequenceState, checked against the config (the rings' count and
// size, the layers, every entry's bytes present from the first; names what it found otherwise).
SequenceState materialize(const Config& config, const StateView& view);

// The same checks alone, for executors that copy the pieces themselves.
void check_view(const Config& config, const StateView& view);

// The total size of pieces.
int64_t total_bytes(std::span<const Bytes> pieces);

// Bytes [offset, offset + n) of the pieces taken as one run, to `out` (refused past their end).
void copy_bytes(std::span<const Bytes> pieces, size_t offset, size_t n, uint8_t* out);
// The same, appended to `out`.
void append_bytes(std::vector<uint8_t>& out, std::span<const Bytes> pieces, size_t offset, size_t n);
// Many copy_bytes at once (each job its pieces' first n bytes to its own `out`), cut into chunks
// spread over the host's cores: a 32K-token state is ~40 MB, which one core copies in milliseconds.
struct ByteGather {
  std::span<const Bytes> pieces;
  size_t n = 0;
  uint8_t* out = nullptr;
};
void gather_bytes(std::span<const ByteGather> jobs);

}  // namespace dsv41
