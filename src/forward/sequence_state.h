#pragma once
// Everything one sequence carries from one forward call to the next, kept in the caches' real
// encoded formats (docs/formats.md), so its memory per token is the deployed one:
//  * per layer, the sliding-window ring of the last W entries (SWA-FP8, slot = position mod W),
//    DSpark's stages included (their rings hold the drafter's context KV, forward/dspark.h);
//  * per kv-source layer, the compressed main KV (KV-FP4) and index keys (MXFP4), one entry per
//    completed group of m tokens, and the fp32 rows of the group still filling up.
#include <cstdint>
#include <map>
#include <vector>

#include "model/config.h"

namespace dsv41 {

// One sequence's KV, in whatever memory holds it: Buffer<T> is the container (std::vector on the
// host, SequenceState; cuda::DeviceBuffer on the device, cuda::DeviceSequence, whose buffers are
// sized for its capacity rather than its entries). The counters are the ones call_plan.h's
// advance() moves, the one rule for both.
template <template <class> class Buffer>
struct CompressedKv {
  int64_t entries = 0;
  Buffer<uint8_t> kv;       // entries × kv_fp4::bytes(head_dim)
  Buffer<uint8_t> index_k;  // entries × mxfp4::bytes(index_head_dim)
  Buffer<float> pending_kv, pending_score;  // the open group's rows (m > 1), fp32 [pending, head_dim]
  int pending = 0;
};

template <template <class> class Buffer>
struct KvState {
  int64_t length = 0;                            // tokens already run
  int64_t decoder_window_floor = 0;              // decoder windows start here (bounded replay)
  int64_t encoder_window_floor = 0;              // encoder windows start here (encoder replay)
  std::vector<Buffer<uint8_t>> window;           // per layer: W × swa_fp8::bytes(head_dim)
  std::map<int, CompressedKv<Buffer>> compressed;  // by kv-source layer
};

template <class T>
using HostBuffer = std::vector<T>;
using CompressedCache = CompressedKv<HostBuffer>;

// The host's: what the CPU executor computes on and the KV tiers store.
struct SequenceState : KvState<HostBuffer> {
  explicit SequenceState(const Config& config);

  // Bytes held for this sequence's KV (what the allocator would report): the global KV (compressed
  // entries and index keys) plus the sliding-window rings.
  int64_t global_kv_bytes() const;
  int64_t window_bytes() const;
  int64_t kv_bytes() const { return global_kv_bytes() + window_bytes(); }
};

}  // namespace dsv41
