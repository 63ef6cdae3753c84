// The decode step's plan (decode_plan.h): the block's fields one after another, each aligned to 16
// bytes, in an order fixed by the config and the row count alone — so the plans of two steps of
// the same sequences differ in values, never in layout, and a captured step reads the next one.
#include "forward/device/decode_plan.h"

#include <algorithm>
#include <utility>
#include <string>

#include "base/error.h"
#include "forward/window.h"
#include "numerics/codecs.h"

namespace dsv41::cuda {

namespace {

// The block's fields, each at the next 16-byte boundary. A field is filled in place through the
// pointer fill() gives right after it is added (a later add may move the bytes), with no list built
// first. The bytes' capacity is kept from one step's plan to the next (DecodeGraph reuses its plan):
// a batch-64 step's block is ~150 KB, built on the host between two steps.
class Block {
 public:
  explicit Block(std::vector<uint8_t>& bytes) : bytes_(bytes) { bytes_.clear(); }
  template <class T>
  size_t add(size_t count) {
    const size_t at = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(at + count * sizeof(T));
    return at;
  }
  template <class T>
  T* fill(size_t offset) {
    return reinterpret_cast<T*>(bytes_.data() + offset);
  }

 private:
  std::vector<uint8_t>& bytes_;
};

}  // namespace

DecodePlan plan_decode(const Config& c, const std::vector<DecodeRow>& rows) {
  DecodePlan p;
  plan_decode(c, rows, p);
  return p;
}

void plan_decode(const Config& c, const std::vector<DecodeRow>& rows, DecodePlan& p) {
  std::vector<uint8_t> bytes = std::move(p.block);  // its capacity, for this plan's block
  p = DecodePlan();
  p.block = std::move(bytes);
  Block block(p.block);
  const size_t B = rows.size();
  const int64_t W = c.window_size;
  const size_t slot = swa_fp8::bytes(int(c.head_dim));

  for (size_t b = 0; b < B; ++b) {
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
  }
  p.tokens = block.add<int32_t>(B);
  for (size_t b = 0; b < B; ++b) block.fill<int32_t>(p.tokens)[b] = rows[b].token;
  p.positions = block.add<int64_t>(B);
  for (size_t b = 0; b < B; ++b) block.fill<int64_t>(p.positions)[b] = rows[b].sequence->length;
  const size_t hc = size_t(c.hc_mult);
  p.pre_mix = block.add<float>(B * hc);
  for (size_t i = 0; i < B * hc; ++i) block.fill<float>(p.pre_mix)[i] = i % hc == 0 ? 1.0f : 0.0f;

  const int cols = c.engram_hash_columns(), n_engram = int(c.engram_layer_ids.size());
  for (int e = 0; e < n_engram; ++e) {
    p.engram_ids.push_back(block.add<int64_t>(B * size_t(cols)));
    for (size_t b = 0; b < B; ++b)
      std::copy_n(rows[b].engram_ids + e * cols, cols, block.fill<int64_t>(p.engram_ids.back()) + b * size_t(cols));
  }

  for (int l = 0; l < c.n_layers; ++l) {
    p.rings.push_back(block.add<uint8_t*>(B));
    p.swa_dest.push_back(block.add<uint8_t*>(B));
    for (size_t b = 0; b < B; ++b) {
      uint8_t* ring = rows[b].sequence->window[size_t(l)].get();
      block.fill<uint8_t*>(p.rings.back())[b] = ring;
      block.fill<uint8_t*>(p.swa_dest.back())[b] = ring + (rows[b].sequence->length % W) * int64_t(slot);
    }
  }

  // Window slots: the W positions up to the row's own, those below the phase's floor empty.
  std::vector<int64_t> positions_in_window;
  for (int phase = 0; phase < 2; ++phase) {
    p.window[phase] = block.add<int32_t>(B * size_t(W));
    for (size_t b = 0; b < B; ++b) {
      const ItemPlan& item = p.items[b];
      window_positions(item.start, item.start, 1, W, phase ? item.decoder_floor : item.encoder_floor, positions_in_window);
      int32_t* list = block.fill<int32_t>(p.window[phase]) + b * size_t(W);
      for (size_t j = 0; j < positions_in_window.size(); ++j) {
        const int64_t t = positions_in_window[j];
        list[j] = int32_t(t == kEmptySlot ? -1 : t % W);
      }
    }
  }

  const size_t kv_bytes = kv_fp4::bytes(int(c.head_dim)), index_bytes = mxfp4::bytes(int(c.index_head_dim));
  for (int l = 0; l < c.n_layers; ++l) {
    if (!c.is_kv_source(l)) continue;
    DecodePlan::Compressed& f = p.compressed[l];
    f.caches = block.add<uint8_t*>(B);
    f.index_caches = block.add<uint8_t*>(B);
    f.open_kv = block.add<float*>(B);
    f.open_score = block.add<float*>(B);
    f.open_rows = block.add<int32_t>(B);
    f.kv_dest = block.add<uint8_t*>(B);
    f.index_dest = block.add<uint8_t*>(B);
    f.group_pos = block.add<int64_t>(B);
    f.entries = block.add<int64_t>(B);
    f.visible = block.add<int64_t>(B);
    for (size_t b = 0; b < B; ++b) {
      const DeviceSequence& s = *rows[b].sequence;
      const DeviceCompressed& cache = s.compressed.at(l);
      const CompressorPlan& g = p.items[b].compressors.at(l);
      const bool closes = g.groups == 1;
      if (g.entries_after() > s.entry_capacity(l))
        fail("cuda decode step", "a compressed cache within its capacity (" + std::to_string(s.entry_capacity(l)) + ")",
             std::to_string(g.entries_after()) + " entries at layer " + std::to_string(l));
      block.fill<uint8_t*>(f.caches)[b] = cache.kv.get();
      block.fill<uint8_t*>(f.index_caches)[b] = cache.index_k.get();
      block.fill<float*>(f.open_kv)[b] = cache.pending_kv.get();
      block.fill<float*>(f.open_score)[b] = cache.pending_score.get();
      block.fill<int32_t>(f.open_rows)[b] = cache.pending;
      block.fill<uint8_t*>(f.kv_dest)[b] = closes ? cache.kv.get() + cache.entries * int64_t(kv_bytes) : nullptr;
      block.fill<uint8_t*>(f.index_dest)[b] = closes ? cache.index_k.get() + cache.entries * int64_t(index_bytes) : nullptr;
      block.fill<int64_t>(f.group_pos)[b] = g.group_pos(0);
      block.fill<int64_t>(f.entries)[b] = g.entries_after();
      block.fill<int64_t>(f.visible)[b] = (s.length + 1) / g.ratio;
    }
  }
}

}  // namespace dsv41::cuda
