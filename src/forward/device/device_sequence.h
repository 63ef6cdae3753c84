#pragma once
// One sequence's KV in device memory, in the formats and layout of SequenceState
// (forward/sequence_state.h, docs/formats.md): per layer the SWA-FP8 ring of W slots (slot =
// position mod W), per kv-source layer the KV-FP4 main cache and the MXFP4 index keys, one entry
// per completed group, and the fp32 rows of the open group. The caches are allocated once for
// `capacity` tokens, so a decode step never reallocates (and a captured step's pointers stay),
// from the stream-ordered pool (a sequence made for a request costs no cudaMalloc).
#include <cstdint>
#include <map>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "forward/sequence_mark.h"
#include "forward/sequence_state.h"
#include "forward/state_view.h"

namespace dsv41::cuda {

using DeviceCompressed = CompressedKv<DeviceBuffer>;

// SequenceState's KvState in device memory: each cache's kv and index_k hold entry_capacity()
// entries, pending_kv and pending_score ratio rows.
class DeviceSequence : public KvState<DeviceBuffer> {
 public:
  DeviceSequence(const Config& config, int64_t capacity);

  int64_t capacity() const { return capacity_; }
  // The entries kv-source `layer`'s cache has room for.
  int64_t entry_capacity(int layer) const { return capacity_ / config_.compress_ratios[size_t(layer)] + 1; }

  // The state of a view (the tiers' pieces, or a host state's memory) copied in: the pieces
  // packed into `staging`, then one copy per cache, on the legacy default stream; waits for them.
  void upload(const StateView& view, PinnedStaging& staging);
  // The state for the KV tiers (Sequence::saved): counters, rings, open groups, and the global KV
  // from the entries of token `from_token` on, copied into `staging`; the view is valid until the
  // staging is used again.
  StateView download(int64_t from_token, PinnedStaging& staging) const;
  // The same state as a host SequenceState, and back (tests; moving a sequence between tiers).
  void upload(const SequenceState& state);
  SequenceState download() const;

  // Undoing a call (forward/sequence_mark.h) on the device: mark() saves, in host memory, what a
  // call of `rows` tokens may change — the counters, each ring's min(rows, W) slots from position
  // `length` on (DSpark's stages' rings included), each compressed cache's entry count and open
  // group; rewind() puts them back. Unlike the host's mark, the open group's rows are saved only
  // when the call can close the group (pending + rows ≥ ratio): a call that does not close it
  // appends after them and leaves them as they are. The bytes past the marked entry counts are
  // not restored: nothing reads past an entry count.
  SequenceMark mark(int64_t rows) const;
  void rewind(const SequenceMark& mark);

 private:
  const Config& config_;
  int64_t capacity_;
};

}  // namespace dsv41::cuda
