#pragma once
// Everything one sequence carries from one forward call to the next, kept in the caches' real
// encoded formats (docs/formats.md), so its memory per token is the deployed one:
//  * per layer, the sliding-window ring of the last W entries (SWA-FP8, slot = position mod W),
//    DSpark's stages included (their rings hold the drafter's context KV, forward/dspark.h);
//  * per kv-source layer, the compressed main KV (KV-FP4) and index keys (MXFP4), one entry per
//    completed group of m tokens, and the fp32 rows of the group still filling up.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "model/config.h"

namespace dsv41 {

// One sequence's KV, in whatever memory holds it: Buffer<T> is the container (std::vector on the
// host, SequenceState; cuda::DeviceBuffer on the device, cuda::DeviceSequence, whose buffers are
// sized for its capacity rather than its entries). The counters are the ones call_plan.h's
// advance() moves, the one rule for both.
// The format of the compressed main KV entries: KV-FP4 (e2m1 + an e4m3 scale per 16, 288 B per
// 512-d entry), the release's and the only one the KV tiers store and the CUDA executor runs; or
// SWA-FP8 (e4m3 + a ue8m0 scale per 32, 528 B), the sliding-window codec's rule, which `dsv41 eval
// --kv-fp8` runs on the CPU executor to measure what FP4 costs (docs/eval.md, docs/decisions.md).
enum class GlobalKvFormat { Fp4, Fp8 };
const char* global_kv_format_name(GlobalKvFormat format);  // "kv-fp4", "swa-fp8"
size_t global_kv_entry_bytes(GlobalKvFormat format, int head_dim);
void encode_global_kv(GlobalKvFormat format, const float* x, int head_dim, uint8_t* out);
void decode_global_kv(GlobalKvFormat format, const uint8_t* in, int head_dim, float* out);

template <template <class> class Buffer>
struct CompressedKv {
  int64_t entries = 0;
  Buffer<uint8_t> kv;       // entries × kv_fp4::bytes(head_dim) (the host's: global_kv_entry_bytes)
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

  GlobalKvFormat global_kv = GlobalKvFormat::Fp4;  // of every compressed.kv entry

  // Bytes held for this sequence's KV (what the allocator would report): the global KV (compressed
  // entries and index keys) plus the sliding-window rings.
  int64_t global_kv_bytes() const;
  int64_t window_bytes() const;
  int64_t kv_bytes() const { return global_kv_bytes() + window_bytes(); }
};

}  // namespace dsv41
