#include "forward/sequence_state.h"

#include "numerics/codecs.h"

namespace dsv41 {

SequenceState::SequenceState(const Config& c) {
  const int rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  window.assign(size_t(rings), std::vector<uint8_t>(size_t(c.window_size) * swa_fp8::bytes(c.head_dim)));
  for (int s : c.kv_source_layers) compressed[s];
}

const char* global_kv_format_name(GlobalKvFormat format) { return format == GlobalKvFormat::Fp4 ? "kv-fp4" : "swa-fp8"; }

size_t global_kv_entry_bytes(GlobalKvFormat format, int d) {
  return format == GlobalKvFormat::Fp4 ? kv_fp4::bytes(d) : swa_fp8::bytes(d);
}

void encode_global_kv(GlobalKvFormat format, const float* x, int d, uint8_t* out) {
  if (format == GlobalKvFormat::Fp4) kv_fp4::encode(x, d, out);
  else swa_fp8::encode(x, d, out);
}

void decode_global_kv(GlobalKvFormat format, const uint8_t* in, int d, float* out) {
  if (format == GlobalKvFormat::Fp4) kv_fp4::decode(in, d, out);
  else swa_fp8::decode(in, d, out);
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
