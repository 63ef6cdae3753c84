#pragma once
// A decode step's plan: everything a step of one row per sequence needs to know that changes from
// step to step — tokens, positions, Engram ids, the window slots each row attends, where each new
// SWA, KV-FP4 and index-key entry goes, each open group's row count, each cache's entry count —
// laid out in one block, so one copy brings it to the device and every kernel of the step reads
// it there. The step's launches are then the same at every position, which lets a captured step
// (decode_graph.h) replay while the context grows; docs/cuda.md draws the block.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "forward/call_plan.h"
#include "forward/device/device_sequence.h"
#include "model/config.h"

namespace dsv41::cuda {

// One sequence's row in a decode step.
struct DecodeRow {
  DeviceSequence* sequence;
  int32_t token;
  const int64_t* engram_ids = nullptr;  // host [engram layers, hash columns]
  int64_t decoder_from = 0;             // ≤ the sequence's length (a decode row is never replayed)
};

struct DecodePlan {
  std::vector<DeviceSequence*> sequences;  // B, the rows' sequences
  std::vector<ItemPlan> items;             // B, each row's call plan (advance() follows it)
  std::vector<uint8_t> block;  // the host image of the block
  // Byte offsets of the fields in the block; [B] unless said.
  size_t tokens = 0;                  // int32
  size_t positions = 0;               // int64
  size_t pre_mix = 0;                 // float [B, hc]: the first input mix, e0
  std::vector<size_t> engram_ids;     // per Engram layer: int64 [B, hash columns]
  std::vector<size_t> rings;          // per layer: uint8_t*, the ring
  std::vector<size_t> swa_dest;       // per layer: uint8_t*, the ring slot of the row's entry
  size_t window[2] = {0, 0};          // encoder / decoder layers: int32 [B, W] ring slots, -1 empty
  struct Compressed {
    size_t caches = 0;                   // uint8_t*, the KV-FP4 cache
    size_t index_caches = 0;             // uint8_t*, the MXFP4 index-key cache
    size_t open_kv = 0, open_score = 0;  // float*, the open group's rows (ratio > 1)
    size_t open_rows = 0;                // int32, its row count before the step
    size_t kv_dest = 0, index_dest = 0;  // uint8_t*, the new entry's place, null if the group stays open
    size_t group_pos = 0;                // int64, the new entry's position (its group's first row)
    size_t entries = 0;                  // int64, the entry count after the step
    size_t visible = 0;                  // int64, the entries a row of this ratio may see
  };
  std::map<int, Compressed> compressed;  // by kv-source layer

  template <class T>
  T* at(uint8_t* base, size_t offset) const { return reinterpret_cast<T*>(base + offset); }
};

// The plan of one decode step over `rows`; checks every row (tokens in the vocabulary, room in
// every cache, a decoder_from that cuts nothing) and names what it found.
DecodePlan plan_decode(const Config& config, const std::vector<DecodeRow>& rows);
// The same into `plan`, whose block keeps its capacity from the plan it held (a DecodeGraph's
// steps reuse one).
void plan_decode(const Config& config, const std::vector<DecodeRow>& rows, DecodePlan& plan);


}  // namespace dsv41::cuda
