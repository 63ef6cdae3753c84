#pragma once
// One sequence's KV in device memory, in the formats and layout of SequenceState
// (forward/sequence_state.h, docs/formats.md): per layer the SWA-FP8 ring of W slots (slot =
// position mod W), per kv-source layer the KV-FP4 main cache and the MXFP4 index keys, one entry
// per completed group, and the fp32 rows of the open group. The caches are allocated once for
// `capacity` tokens, so a decode step never reallocates (and a captured step's pointers stay).
#include <cstdint>
#include <map>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "forward/sequence_state.h"

namespace dsv41::cuda {

struct DeviceCompressed {
  int ratio = 0;
  int64_t entries = 0, capacity = 0;
  DeviceBuffer<uint8_t> kv, index_k;               // capacity × kv_fp4::bytes(head_dim), × mxfp4::bytes(index_head_dim)
  DeviceBuffer<float> pending_kv, pending_score;  // ratio × head_dim (m > 1)
  int pending = 0;
};

class DeviceSequence {
 public:
  DeviceSequence(const Config& config, int64_t capacity);

  int64_t capacity() const { return capacity_; }
  int64_t length = 0;
  int64_t decoder_window_floor = 0;
  int64_t encoder_window_floor = 0;
  std::vector<DeviceBuffer<uint8_t>> window;    // per layer: W × swa_fp8::bytes(head_dim)
  std::map<int, DeviceCompressed> compressed;  // by kv-source layer

  // The same state as a host SequenceState, and back (tests; moving a sequence between tiers).
  void upload(const SequenceState& state);
  SequenceState download() const;

 private:
  const Config& config_;
  int64_t capacity_;
};

}  // namespace dsv41::cuda
