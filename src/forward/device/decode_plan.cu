// The decode step's plan (decode_plan.h): the block's fields one after another, each aligned to 16
// bytes, in an order fixed by the config and the row count alone — so the plans of two steps of
// the same sequences differ in values, never in layout, and a captured step reads the next one.
#include "forward/device/decode_plan.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "forward/window.h"
#include "numerics/codecs.h"

namespace dsv41::cuda {

namespace {

class Block {
 public:
  explicit Block(std::vector<uint8_t>& bytes) : bytes_(bytes) {}
  template <class T>
  size_t add(const std::vector<T>& values) {
    const size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + values.size() * sizeof(T));
    if (!values.empty()) std::memcpy(bytes_.data() + at, values.data(), values.size() * sizeof(T));
    return at;
  }

 private:
  std::vector<uint8_t>& bytes_;
};

}  // namespace

DecodePlan plan_decode(const Config& c, const std::vector<DecodeRow>& rows) {
  DecodePlan p;
  Block block(p.block);
  const int64_t W = c.window_size;
  const size_t slot = swa_fp8::bytes(int(c.head_dim));

  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<float> pre_mix(rows.size() * size_t(c.hc_mult), 0.0f);
  for (size_t b = 0; b < rows.size(); ++b) {
    const DecodeRow& r = rows[b];
    const DeviceSequence& s = *r.sequence;
    if (r.token < 0 || r.token >= c.vocab_size)
      fail("cuda decode step", "token ids in [0, " + std::to_string(c.vocab_size) + ")", std::to_string(r.token));
    if (s.length == 0) fail("cuda decode step", "a sequence with a prefill behind it", "an empty sequence");
    if (s.length + 1 > s.capacity())
      fail("cuda decode step", "at most " + std::to_string(s.capacity()) + " tokens in a sequence", std::to_string(s.length + 1));
    if (r.decoder_from > s.length)
      fail("cuda decode step", "decoder_from at most the sequence's length " + std::to_string(s.length) + " (a decode row is never replayed)",
           std::to_string(r.decoder_from));
    if (c.has_engram() && !r.engram_ids) fail("cuda decode step", "Engram hash ids for a model with Engram", "none");
    for (size_t b2 = 0; b2 < b; ++b2)
      if (rows[b2].sequence == r.sequence) fail("cuda decode step", "each sequence once in a step", "a sequence twice");
    p.sequences.push_back(r.sequence);
    ForwardOptions options;
    options.decoder_from = r.decoder_from;
    p.items.push_back(plan_item(c, s, 1, options));
    tokens.push_back(r.token);
    positions.push_back(s.length);
    pre_mix[b * size_t(c.hc_mult)] = 1.0f;
  }
  p.tokens = block.add(tokens);
  p.positions = block.add(positions);
  p.pre_mix = block.add(pre_mix);

  const int cols = c.engram_hash_columns(), n_engram = int(c.engram_layer_ids.size());
  for (int e = 0; e < n_engram; ++e) {
    std::vector<int64_t> ids;
    for (const DecodeRow& r : rows) ids.insert(ids.end(), r.engram_ids + e * cols, r.engram_ids + (e + 1) * cols);
    p.engram_ids.push_back(block.add(ids));
  }

  for (int l = 0; l < c.n_layers; ++l) {
    std::vector<uint8_t*> rings, dest;
    for (const DecodeRow& r : rows) {
      uint8_t* ring = r.sequence->window[size_t(l)].get();
      rings.push_back(ring);
      dest.push_back(ring + (r.sequence->length % W) * int64_t(slot));
    }
    p.rings.push_back(block.add(rings));
    p.swa_dest.push_back(block.add(dest));
  }

  // Window slots: the W positions up to the row's own, those below the phase's floor empty.
  std::vector<int64_t> positions_in_window;
  for (int phase = 0; phase < 2; ++phase) {
    std::vector<int32_t> list;
    for (const ItemPlan& item : p.items) {
      const int64_t floor = phase ? item.decoder_floor : item.encoder_floor;
      window_positions(item.start, item.start, 1, W, floor, positions_in_window);
      for (int64_t t : positions_in_window) list.push_back(int32_t(t == kEmptySlot ? -1 : t % W));
    }
    p.window[phase] = block.add(list);
  }

  const size_t kv_bytes = kv_fp4::bytes(int(c.head_dim)), index_bytes = mxfp4::bytes(int(c.index_head_dim));
  for (int l = 0; l < c.n_layers; ++l) {
    if (!c.is_kv_source(l)) continue;
    std::vector<uint8_t*> caches, index_caches, kv_dest, index_dest;
    std::vector<float*> open_kv, open_score;
    std::vector<int32_t> open_rows;
    std::vector<int64_t> group_pos, entries, visible;
    for (size_t b = 0; b < rows.size(); ++b) {
      const DecodeRow& r = rows[b];
      DeviceCompressed& cache = r.sequence->compressed.at(l);
      const CompressorPlan& g = p.items[b].compressors.at(l);
      const bool closes = g.groups == 1;
      if (g.entries_after() > r.sequence->entry_capacity(l))
        fail("cuda decode step", "a compressed cache within its capacity (" + std::to_string(r.sequence->entry_capacity(l)) + ")",
             std::to_string(g.entries_after()) + " entries at layer " + std::to_string(l));
      caches.push_back(cache.kv.get());
      index_caches.push_back(cache.index_k.get());
      open_kv.push_back(cache.pending_kv.get());
      open_score.push_back(cache.pending_score.get());
      open_rows.push_back(cache.pending);
      kv_dest.push_back(closes ? cache.kv.get() + cache.entries * int64_t(kv_bytes) : nullptr);
      index_dest.push_back(closes ? cache.index_k.get() + cache.entries * int64_t(index_bytes) : nullptr);
      group_pos.push_back(g.group_pos(0));
      entries.push_back(g.entries_after());
      visible.push_back((r.sequence->length + 1) / g.ratio);
    }
    DecodePlan::Compressed& f = p.compressed[l];
    f.caches = block.add(caches);
    f.index_caches = block.add(index_caches);
    f.open_kv = block.add(open_kv);
    f.open_score = block.add(open_score);
    f.open_rows = block.add(open_rows);
    f.kv_dest = block.add(kv_dest);
    f.index_dest = block.add(index_dest);
    f.group_pos = block.add(group_pos);
    f.entries = block.add(entries);
    f.visible = block.add(visible);
  }
  return p;
}

}  // namespace dsv41::cuda
