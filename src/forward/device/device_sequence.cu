#include "forward/device/device_sequence.h"

#include <algorithm>
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
    window.emplace_back(ring);
    check(cudaMemset(window.back().get(), 0, size_t(ring)), "DeviceSequence");  // as SequenceState's rings
  }
  for (int s : c.kv_source_layers) {
    DeviceCompressed& d = compressed[s];
    const int ratio = c.compress_ratios[size_t(s)];
    d.kv = DeviceBuffer<uint8_t>(entry_capacity(s) * int64_t(kv_fp4::bytes(c.head_dim)));
    d.index_k = DeviceBuffer<uint8_t>(entry_capacity(s) * int64_t(mxfp4::bytes(c.index_head_dim)));
    if (ratio > 1) {
      d.pending_kv = DeviceBuffer<float>(ratio * int64_t(c.head_dim));
      d.pending_score = DeviceBuffer<float>(ratio * int64_t(c.head_dim));
    }
  }
}

void DeviceSequence::upload(const SequenceState& s) {
  const Config& c = config_;
  if (s.length > capacity_)
    fail("DeviceSequence::upload", "at most " + std::to_string(capacity_) + " tokens", std::to_string(s.length));
  const size_t ring = size_t(c.window_size) * swa_fp8::bytes(c.head_dim);
  if (s.window.size() != window.size())
    fail("DeviceSequence::upload", std::to_string(window.size()) + " rings", std::to_string(s.window.size()));
  for (size_t l = 0; l < window.size(); ++l)
    if (s.window[l].size() != ring)
      fail("DeviceSequence::upload", std::to_string(ring) + " bytes of window in layer " + std::to_string(l),
           std::to_string(s.window[l].size()));
  for (auto& [layer, d] : compressed) {
    const CompressedCache& h = s.compressed.at(layer);
    const int ratio = c.compress_ratios[size_t(layer)];
    const size_t want_kv = size_t(h.entries) * kv_fp4::bytes(c.head_dim), want_k = size_t(h.entries) * mxfp4::bytes(c.index_head_dim);
    if (h.entries > entry_capacity(layer) || h.kv.size() < want_kv || h.index_k.size() < want_k || h.pending >= std::max(ratio, 1))
      fail("DeviceSequence::upload", "layer " + std::to_string(layer) + ": at most " + std::to_string(entry_capacity(layer)) +
                                         " entries with their bytes and fewer open rows than the ratio",
           std::to_string(h.entries) + " entries, " + std::to_string(h.kv.size()) + " + " + std::to_string(h.index_k.size()) +
               " bytes, " + std::to_string(h.pending) + " open rows");
  }
  length = s.length;
  decoder_window_floor = s.decoder_window_floor;
  encoder_window_floor = s.encoder_window_floor;
  for (size_t l = 0; l < window.size(); ++l) window[l].upload(s.window[l]);
  for (auto& [layer, d] : compressed) {
    const CompressedCache& h = s.compressed.at(layer);
    d.entries = h.entries;
    d.kv.upload(h.kv.data(), h.entries * int64_t(kv_fp4::bytes(c.head_dim)));
    d.index_k.upload(h.index_k.data(), h.entries * int64_t(mxfp4::bytes(c.index_head_dim)));
    d.pending = h.pending;
    if (c.compress_ratios[size_t(layer)] > 1 && h.pending > 0) {
      d.pending_kv.upload(h.pending_kv.data(), int64_t(h.pending) * c.head_dim);
      d.pending_score.upload(h.pending_score.data(), int64_t(h.pending) * c.head_dim);
    }
  }
  check(cudaDeviceSynchronize(), "DeviceSequence::upload");
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
