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
  // A ring per layer with a window, as SequenceState's: DSpark's stages' too (their context KV
  // travels with the sequence, though the device forward does not run them yet).
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

}  // namespace dsv41::cuda
