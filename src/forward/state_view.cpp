#include "forward/state_view.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "base/error.h"
#include "numerics/codecs.h"

namespace dsv41 {

namespace {

template <class T>
Bytes as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

template <class T>
std::vector<T> concat(std::span<const Bytes> pieces) {
  std::vector<T> out(size_t(total_bytes(pieces)) / sizeof(T));
  copy_bytes(pieces, 0, out.size() * sizeof(T), reinterpret_cast<uint8_t*>(out.data()));
  return out;
}

}  // namespace

int64_t total_bytes(std::span<const Bytes> pieces) {
  int64_t n = 0;
  for (Bytes p : pieces) n += int64_t(p.size());
  return n;
}

void copy_bytes(std::span<const Bytes> pieces, size_t offset, size_t n, uint8_t* out) {
  if (offset + n > size_t(total_bytes(pieces)))
    fail("sequence state", "bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) + ") of its pieces",
         std::to_string(total_bytes(pieces)) + " bytes");
  for (Bytes p : pieces) {
    if (n == 0) break;
    if (offset >= p.size()) {
      offset -= p.size();
      continue;
    }
    const size_t take = std::min(n, p.size() - offset);
    std::memcpy(out, p.data() + offset, take);
    out += take, offset = 0, n -= take;
  }
}

void append_bytes(std::vector<uint8_t>& out, std::span<const Bytes> pieces, size_t offset, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  copy_bytes(pieces, offset, n, out.data() + at);
}

void gather_bytes(std::span<const ByteGather> jobs) {
  constexpr size_t kChunk = size_t(1) << 20;  // large enough that walking a job's pieces costs nothing
  struct Chunk {
    const ByteGather* job;
    size_t offset, n;
  };
  std::vector<Chunk> chunks;
  for (const ByteGather& job : jobs) {
    if (size_t(total_bytes(job.pieces)) < job.n)
      fail("sequence state", std::to_string(job.n) + " bytes of pieces", std::to_string(total_bytes(job.pieces)) + " bytes");
    for (size_t at = 0; at < job.n; at += kChunk) chunks.push_back({&job, at, std::min(kChunk, job.n - at)});
  }
#pragma omp parallel for schedule(dynamic, 1) if (chunks.size() > 1)
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    copy_bytes(c.job->pieces, c.offset, c.n, c.job->out + c.offset);
  }
}

StateView view_of(const SequenceState& s) {
  // A view's entries are read as KV-FP4 wherever it goes (the tiers, the CUDA executor's upload).
  if (s.global_kv != GlobalKvFormat::Fp4)
    fail("view_of", "a sequence state with KV-FP4 global KV (what the KV tiers and the CUDA executor hold)",
         global_kv_format_name(s.global_kv));
  StateView v;
  v.length = s.length;
  v.decoder_window_floor = s.decoder_window_floor;
  v.encoder_window_floor = s.encoder_window_floor;
  for (const auto& ring : s.window) v.window.push_back(as_bytes(ring));
  for (const auto& [layer, h] : s.compressed) {
    StateView::Compressed& c = v.compressed[layer];
    c.entries = h.entries;
    c.kv = {as_bytes(h.kv)};
    c.index_k = {as_bytes(h.index_k)};
    c.pending = h.pending;
    c.pending_kv = as_bytes(h.pending_kv);
    c.pending_score = as_bytes(h.pending_score);
  }
  return v;
}

void check_view(const Config& c, const StateView& v) {
  const int rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  const size_t ring = size_t(c.window_size) * swa_fp8::bytes(c.head_dim);
  if (!v.window.empty() && int(v.window.size()) != rings)
    fail("sequence state", std::to_string(rings) + " rings", std::to_string(v.window.size()));
  for (size_t l = 0; l < v.window.size(); ++l)
    if (v.window[l].size() != ring)
      fail("sequence state", std::to_string(ring) + " bytes of window in layer " + std::to_string(l),
           std::to_string(v.window[l].size()));
  if (v.compressed.size() != c.kv_source_layers.size())
    fail("sequence state", std::to_string(c.kv_source_layers.size()) + " kv-source layers", std::to_string(v.compressed.size()));
  for (int s : c.kv_source_layers) {
    auto it = v.compressed.find(s);
    if (it == v.compressed.end()) fail("sequence state", "kv-source layer " + std::to_string(s), "no such layer");
    const StateView::Compressed& h = it->second;
    const int ratio = c.compress_ratios[size_t(s)];
    const int64_t kv = total_bytes(h.kv), keys = total_bytes(h.index_k), held = h.entries - h.first;
    const int64_t want_kv = held * int64_t(kv_fp4::bytes(c.head_dim)), want_k = held * int64_t(mxfp4::bytes(c.index_head_dim));
    const int64_t row = int64_t(c.head_dim) * int64_t(sizeof(float));
    if (h.first < 0 || held < 0 || kv < want_kv || keys < want_k || h.pending < 0 || h.pending >= std::max(ratio, 1) ||
        int64_t(h.pending_kv.size()) < h.pending * row || int64_t(h.pending_score.size()) < h.pending * row)
      fail("sequence state", "layer " + std::to_string(s) + ": every entry's bytes and fewer open rows than the ratio, with theirs",
           std::to_string(h.entries) + " entries, " + std::to_string(kv) + " + " + std::to_string(keys) + " bytes, " +
               std::to_string(h.pending) + " open rows");
  }
}

SequenceState materialize(const Config& c, const StateView& v) {
  check_view(c, v);
  for (const auto& [layer, h] : v.compressed)
    if (h.first != 0) fail("sequence state", "every entry of layer " + std::to_string(layer), "entries from " + std::to_string(h.first));
  SequenceState s(c);
  s.length = v.length;
  s.decoder_window_floor = v.decoder_window_floor;
  s.encoder_window_floor = v.encoder_window_floor;
  for (size_t l = 0; l < v.window.size(); ++l) s.window[l].assign(v.window[l].begin(), v.window[l].end());
  for (const auto& [layer, h] : v.compressed) {
    CompressedCache& cache = s.compressed.at(layer);
    cache.entries = h.entries;
    cache.kv = concat<uint8_t>(h.kv);
    cache.index_k = concat<uint8_t>(h.index_k);
    cache.pending = h.pending;
    cache.pending_kv = concat<float>(std::span(&h.pending_kv, 1));
    cache.pending_score = concat<float>(std::span(&h.pending_score, 1));
  }
  return s;
}

}  // namespace dsv41
