#include "forward/sequence_state.h"

#include "numerics/codecs.h"

namespace dsv41 {

SequenceState::SequenceState(const Config& c) {
  const int rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  window.assign(size_t(rings), std::vector<uint8_t>(size_t(c.window_size) * swa_fp8::bytes(c.head_dim)));
  for (int s : c.kv_source_layers) compressed[s];
}

int64_t SequenceState::global_kv_bytes() const {
  int64_t bytes = 0;
  for (const auto& [layer, c] : compressed) bytes += int64_t(c.kv.size() + c.index_k.size());
  return bytes;
}

int64_t SequenceState::window_bytes() const {
  int64_t bytes = 0;
  for (const auto& w : window) bytes += int64_t(w.size());
  return bytes;
}

}  // namespace dsv41
