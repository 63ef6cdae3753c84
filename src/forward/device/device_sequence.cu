#include "forward/device/device_sequence.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "numerics/codecs.h"

namespace dsv41::cuda {

DeviceSequence::DeviceSequence(const Config& c, int64_t capacity) : config_(c), capacity_(capacity) {
  if (capacity <= 0) fail("DeviceSequence", "a positive capacity in tokens", std::to_string(capacity));
  const int64_t ring = c.window_size * int64_t(swa_fp8::bytes(c.head_dim));
  // A ring per layer with a window, as SequenceState's: DSpark's stages' too (their context KV,
  // device_dspark.h, travels with the sequence).
  const int rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  for (int l = 0; l < rings; ++l) {
    window.push_back(pooled<uint8_t>(ring));
    check(cudaMemsetAsync(window.back().get(), 0, size_t(ring)), "DeviceSequence");  // as SequenceState's rings
  }
  for (int s : c.kv_source_layers) {
    DeviceCompressed& d = compressed[s];
    const int ratio = c.compress_ratios[size_t(s)];
    d.kv = pooled<uint8_t>(entry_capacity(s) * int64_t(kv_fp4::bytes(c.head_dim)));
    d.index_k = pooled<uint8_t>(entry_capacity(s) * int64_t(mxfp4::bytes(c.index_head_dim)));
    if (ratio > 1) {
      d.pending_kv = pooled<float>(ratio * int64_t(c.head_dim));
      d.pending_score = pooled<float>(ratio * int64_t(c.head_dim));
    }
  }
}

void DeviceSequence::upload(const StateView& v, PinnedStaging& staging) {
  const Config& c = config_;
  check_view(c, v);
  if (v.length > capacity_)
    fail("DeviceSequence::upload", "at most " + std::to_string(capacity_) + " tokens", std::to_string(v.length));
  for (const auto& [layer, h] : v.compressed)
    if (h.first != 0 || h.entries > entry_capacity(layer))
      fail("DeviceSequence::upload", "layer " + std::to_string(layer) + ": entries 0 to at most " + std::to_string(entry_capacity(layer)),
           "entries " + std::to_string(h.first) + " to " + std::to_string(h.entries));
  if (!v.window.empty() && v.window.size() != window.size())
    fail("DeviceSequence::upload", std::to_string(window.size()) + " rings", std::to_string(v.window.size()));

  // Each destination's pieces, packed one after another into the staging memory.
  struct Copy {
    void* to;
    std::vector<Bytes> pieces;
    size_t bytes;
  };
  std::vector<Copy> copies;
  auto copy = [&](void* to, std::vector<Bytes> pieces, int64_t bytes) {
    if (bytes > 0) copies.push_back(Copy{to, std::move(pieces), size_t(bytes)});
  };
  for (size_t l = 0; l < v.window.size(); ++l) copy(window[l].get(), {v.window[l]}, int64_t(v.window[l].size()));
  const int64_t row = int64_t(c.head_dim) * int64_t(sizeof(float));
  for (auto& [layer, d] : compressed) {
    const StateView::Compressed& h = v.compressed.at(layer);
    copy(d.kv.get(), h.kv, h.entries * int64_t(kv_fp4::bytes(c.head_dim)));
    copy(d.index_k.get(), h.index_k, h.entries * int64_t(mxfp4::bytes(c.index_head_dim)));
    if (c.compress_ratios[size_t(layer)] > 1) {
      copy(d.pending_kv.get(), {h.pending_kv}, h.pending * row);
      copy(d.pending_score.get(), {h.pending_score}, h.pending * row);
    }
  }
  // Packed on the host's cores (the pieces may hold more than the entries: a host state's spare
  // room), then one copy per cache.
  size_t total = 0;
  for (const Copy& k : copies) total += k.bytes;
  uint8_t* at = staging.reserve(total);
  std::vector<ByteGather> jobs;
  for (const Copy& k : copies) {
    jobs.push_back({k.pieces, k.bytes, at});
    at += k.bytes;
  }
  gather_bytes(jobs);
  for (size_t i = 0; i < copies.size(); ++i)
    check(cudaMemcpyAsync(copies[i].to, jobs[i].out, copies[i].bytes, cudaMemcpyHostToDevice, nullptr), "DeviceSequence::upload");
  if (v.window.empty())  // an SWA miss: every ring zero, as a fresh SequenceState's
    for (auto& ring : window) check(cudaMemsetAsync(ring.get(), 0, size_t(ring.bytes())), "DeviceSequence::upload");

  length = v.length;
  decoder_window_floor = v.decoder_window_floor;
  encoder_window_floor = v.encoder_window_floor;
  for (auto& [layer, d] : compressed) {
    d.entries = v.compressed.at(layer).entries;
    d.pending = v.compressed.at(layer).pending;
  }
  check(cudaStreamSynchronize(nullptr), "DeviceSequence::upload");  // the staging is free again
}

void DeviceSequence::upload(const SequenceState& s) {
  PinnedStaging staging;
  upload(view_of(s), staging);
}

StateView DeviceSequence::download(int64_t from_token, PinnedStaging& staging) const {
  const Config& c = config_;
  const size_t entry = kv_fp4::bytes(c.head_dim), key = mxfp4::bytes(c.index_head_dim);
  struct Copy {
    const void* from;
    size_t bytes;
  };
  std::vector<Copy> copies;  // in the order the view takes them
  for (const auto& ring : window) copies.push_back({ring.get(), size_t(ring.bytes())});
  for (const auto& [layer, d] : compressed) {
    const int64_t first = std::min(d.entries, std::max<int64_t>(0, from_token / c.compress_ratios[size_t(layer)]));
    copies.push_back({d.kv.get() + first * int64_t(entry), size_t(d.entries - first) * entry});
    copies.push_back({d.index_k.get() + first * int64_t(key), size_t(d.entries - first) * key});
    copies.push_back({d.pending_kv.get(), size_t(d.pending_kv.bytes())});
    copies.push_back({d.pending_score.get(), size_t(d.pending_score.bytes())});
  }
  size_t total = 0;
  for (const Copy& k : copies) total += k.bytes;
  uint8_t* base = staging.reserve(total);
  std::vector<Bytes> pieces;
  for (const Copy& k : copies) {
    if (k.bytes) check(cudaMemcpyAsync(base, k.from, k.bytes, cudaMemcpyDeviceToHost, nullptr), "DeviceSequence::download");
    pieces.emplace_back(base, k.bytes);
    base += k.bytes;
  }
  check(cudaStreamSynchronize(nullptr), "DeviceSequence::download");

  StateView v;
  v.length = length;
  v.decoder_window_floor = decoder_window_floor;
  v.encoder_window_floor = encoder_window_floor;
  size_t at = 0;
  for (size_t l = 0; l < window.size(); ++l) v.window.push_back(pieces[at++]);
  for (const auto& [layer, d] : compressed) {
    StateView::Compressed& h = v.compressed[layer];
    h.entries = d.entries;
    h.first = std::min(d.entries, std::max<int64_t>(0, from_token / c.compress_ratios[size_t(layer)]));
    h.kv = {pieces[at++]};
    h.index_k = {pieces[at++]};
    h.pending = d.pending;
    h.pending_kv = pieces[at++];
    h.pending_score = pieces[at++];
  }
  return v;
}

SequenceState DeviceSequence::download() const {
  const Config& c = config_;
  SequenceState s(c);
  s.length = length;
  s.decoder_window_floor = decoder_window_floor;
  s.encoder_window_floor = encoder_window_floor;
  for (size_t l = 0; l < window.size(); ++l) s.window[l] = window[l].download();
  for (const auto& [layer, d] : compressed) {
    CompressedCache& h = s.compressed.at(layer);
    h.entries = d.entries;
    h.kv = d.kv.download(nullptr, d.entries * int64_t(kv_fp4::bytes(c.head_dim)));
    h.index_k = d.index_k.download(nullptr, d.entries * int64_t(mxfp4::bytes(c.index_head_dim)));
    h.pending = d.pending;
    if (c.compress_ratios[size_t(layer)] > 1) {
      h.pending_kv = d.pending_kv.download();
      h.pending_score = d.pending_score.download();
    }
  }
  return s;
}

namespace {

// The ring slots of positions length .. length + n − 1, n = min(rows, W), as runs of consecutive
// slots (at most two: the ring wraps once).
std::vector<std::pair<int64_t, int64_t>> slot_runs(const Config& c, int64_t length, int64_t rows) {
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first slot, count)
  const int64_t W = c.window_size, n = std::min<int64_t>(rows, W), first = length % W;
  runs.emplace_back(first, std::min(n, W - first));
  if (n > W - first) runs.emplace_back(0, n - (W - first));
  return runs;
}

}  // namespace

SequenceMark DeviceSequence::mark(int64_t rows) const {
  const Config& c = config_;
  if (rows < 1) fail("mark", "a call of at least one row", std::to_string(rows));
  SequenceMark m;
  m.length = length, m.rows = rows;
  m.decoder_window_floor = decoder_window_floor, m.encoder_window_floor = encoder_window_floor;
  const size_t slot = swa_fp8::bytes(c.head_dim);
  const auto runs = slot_runs(c, length, rows);
  for (const auto& ring : window) {
    std::vector<uint8_t>& saved = m.slots.emplace_back();
    for (const auto& [first, count] : runs) {
      const size_t at = saved.size();
      saved.resize(at + size_t(count) * slot);
      check(cudaMemcpyAsync(saved.data() + at, ring.get() + first * int64_t(slot), size_t(count) * slot, cudaMemcpyDeviceToHost, nullptr),
            "DeviceSequence::mark");
    }
  }
  const int64_t row = int64_t(c.head_dim);
  for (const auto& [layer, d] : compressed) {
    SequenceMark::Compressed& saved = m.compressed[layer];
    const int ratio = c.compress_ratios[size_t(layer)];
    saved.entries = d.entries;
    saved.kv_bytes = size_t(d.entries) * kv_fp4::bytes(c.head_dim);
    saved.index_bytes = size_t(d.entries) * mxfp4::bytes(c.index_head_dim);
    saved.pending = d.pending;
    if (ratio > 1 && d.pending > 0 && d.pending + rows >= ratio) {
      saved.pending_kv = d.pending_kv.download(nullptr, d.pending * row);
      saved.pending_score = d.pending_score.download(nullptr, d.pending * row);
    }
  }
  check(cudaStreamSynchronize(nullptr), "DeviceSequence::mark");
  return m;
}

void DeviceSequence::rewind(const SequenceMark& m) {
  const Config& c = config_;
  if (length < m.length || length > m.length + m.rows || window.size() != m.slots.size())
    fail("rewind", "a state at most " + std::to_string(m.rows) + " positions past its mark at " + std::to_string(m.length),
         "one of " + std::to_string(length) + " positions");
  const size_t slot = swa_fp8::bytes(c.head_dim);
  const auto runs = slot_runs(c, m.length, m.rows);
  for (size_t r = 0; r < window.size(); ++r) {
    size_t at = 0;
    for (const auto& [first, count] : runs) {
      check(cudaMemcpyAsync(window[r].get() + first * int64_t(slot), m.slots[r].data() + at, size_t(count) * slot,
                            cudaMemcpyHostToDevice, nullptr), "DeviceSequence::rewind");
      at += size_t(count) * slot;
    }
  }
  for (auto& [layer, d] : compressed) {
    const SequenceMark::Compressed& saved = m.compressed.at(layer);
    d.entries = saved.entries;
    d.pending = saved.pending;
    if (!saved.pending_kv.empty()) {
      d.pending_kv.upload(saved.pending_kv, nullptr);
      d.pending_score.upload(saved.pending_score, nullptr);
    }
  }
  length = m.length;
  decoder_window_floor = m.decoder_window_floor;
  encoder_window_floor = m.encoder_window_floor;
  check(cudaStreamSynchronize(nullptr), "DeviceSequence::rewind");
}

}  // namespace dsv41::cuda
