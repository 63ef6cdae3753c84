#include "kv/sequence_blocks.h"

#include <cstring>

#include "base/error.h"
#include "numerics/codecs.h"

namespace dsv41 {

namespace {

size_t entry_bytes(const Config& c) { return kv_fp4::bytes(c.head_dim); }
size_t key_bytes(const Config& c) { return mxfp4::bytes(c.index_head_dim); }

void check_block_tokens(const Config& c, int block_tokens) {
  for (int s : c.kv_source_layers)
    if (block_tokens <= 0 || block_tokens % c.compress_ratios[size_t(s)] != 0)
      fail("KV block", "a size that is a positive multiple of every compression ratio",
           std::to_string(block_tokens) + " tokens (layer " + std::to_string(s) + " has ratio " +
               std::to_string(c.compress_ratios[size_t(s)]) + ")");
}

// A little writer/reader pair for the tail's fields, in a fixed order.
struct Writer {
  std::vector<uint8_t> out;
  void bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    if (n) out.insert(out.end(), b, b + n);  // an empty field's data() may be null
  }
  void i64(int64_t v) { bytes(&v, sizeof v); }
  void blob(Bytes v) {
    i64(int64_t(v.size()));
    bytes(v.data(), v.size());
  }
  void floats(Bytes v) {  // fp32 values, as bytes
    i64(int64_t(v.size() / sizeof(float)));
    bytes(v.data(), v.size());
  }
};

// Reads the fields in place: blobs and float arrays as views of the tail's bytes.
struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  Bytes take(size_t n) {
    if (at + n > in.size()) fail("KV tail", std::to_string(at + n) + " bytes", std::to_string(in.size()));
    const Bytes b(in.data() + at, n);
    at += n;
    return b;
  }
  int64_t i64() {
    int64_t v;
    std::memcpy(&v, take(sizeof v).data(), sizeof v);
    return v;
  }
  size_t count(size_t unit) {
    const int64_t n = i64();
    if (n < 0 || size_t(n) > (in.size() - at) / unit)
      fail("KV tail", "a field within its " + std::to_string(in.size()) + " bytes", std::to_string(n) + " items at byte " + std::to_string(at));
    return size_t(n);
  }
  Bytes blob() { return take(count(1)); }
  Bytes floats() { return take(count(sizeof(float)) * sizeof(float)); }
};

}  // namespace

int64_t global_block_bytes(const Config& c, int block_tokens) {
  check_block_tokens(c, block_tokens);
  int64_t bytes = 0;
  for (int s : c.kv_source_layers) bytes += block_tokens / c.compress_ratios[size_t(s)] * int64_t(entry_bytes(c) + key_bytes(c));
  return bytes;
}

std::vector<uint8_t> global_block(const Config& c, const StateView& state, int64_t block, int block_tokens) {
  check_block_tokens(c, block_tokens);
  if ((block + 1) * block_tokens > state.length)
    fail("KV block " + std::to_string(block), "a state holding its " + std::to_string(block_tokens) + " tokens",
         std::to_string(state.length) + " tokens");
  std::vector<uint8_t> out;
  out.reserve(size_t(global_block_bytes(c, block_tokens)));
  for (int s : c.kv_source_layers) {
    const StateView::Compressed& cache = state.compressed.at(s);
    const int64_t per_block = block_tokens / c.compress_ratios[size_t(s)], first = block * per_block - cache.first;
    if (first < 0)
      fail("KV block " + std::to_string(block), "a state holding its entries",
           "layer " + std::to_string(s) + "'s from entry " + std::to_string(cache.first));
    append_bytes(out, cache.kv, size_t(first) * entry_bytes(c), size_t(per_block) * entry_bytes(c));
    append_bytes(out, cache.index_k, size_t(first) * key_bytes(c), size_t(per_block) * key_bytes(c));
  }
  return out;
}

std::vector<uint8_t> global_block(const Config& c, const SequenceState& state, int64_t block, int block_tokens) {
  return global_block(c, view_of(state), block, block_tokens);
}

std::vector<uint8_t> sequence_tail(const Config& c, const StateView& state, int block_tokens) {
  check_block_tokens(c, block_tokens);
  const int64_t blocks = state.length / block_tokens;
  const int rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  if (int(state.window.size()) != rings)
    fail("KV tail", std::to_string(rings) + " rings", std::to_string(state.window.size()));
  Writer w;
  w.i64(state.length);
  w.i64(state.decoder_window_floor);
  w.i64(state.encoder_window_floor);
  for (Bytes ring : state.window) w.blob(ring);
  for (int s : c.kv_source_layers) {
    const StateView::Compressed& cache = state.compressed.at(s);
    const int64_t first = blocks * (block_tokens / c.compress_ratios[size_t(s)]);
    if (first < cache.first)
      fail("KV tail", "a state holding the entries past its blocks",
           "layer " + std::to_string(s) + "'s from entry " + std::to_string(cache.first));
    w.i64(cache.entries - first);
    append_bytes(w.out, cache.kv, size_t(first - cache.first) * entry_bytes(c), size_t(cache.entries - first) * entry_bytes(c));
    append_bytes(w.out, cache.index_k, size_t(first - cache.first) * key_bytes(c), size_t(cache.entries - first) * key_bytes(c));
    w.i64(cache.pending);
    w.floats(cache.pending_kv);
    w.floats(cache.pending_score);
  }
  return std::move(w.out);
}

std::vector<uint8_t> sequence_tail(const Config& c, const SequenceState& state, int block_tokens) {
  return sequence_tail(c, view_of(state), block_tokens);
}

StateView view_sequence(const Config& c, std::span<const Bytes> blocks, int block_tokens, const std::vector<uint8_t>* tail) {
  check_block_tokens(c, block_tokens);
  StateView v;
  for (int s : c.kv_source_layers) v.compressed[s];
  for (size_t b = 0; b < blocks.size(); ++b) {
    size_t at = 0;
    for (int s : c.kv_source_layers) {
      StateView::Compressed& cache = v.compressed.at(s);
      const int64_t per_block = block_tokens / c.compress_ratios[size_t(s)];
      const size_t kv = size_t(per_block) * entry_bytes(c), keys = size_t(per_block) * key_bytes(c);
      if (at + kv + keys > blocks[b].size())
        fail("KV block " + std::to_string(b), "at least " + std::to_string(at + kv + keys) + " bytes",
             std::to_string(blocks[b].size()));
      cache.kv.push_back(blocks[b].subspan(at, kv));
      cache.index_k.push_back(blocks[b].subspan(at + kv, keys));
      cache.entries += per_block;
      at += kv + keys;
    }
    if (at != blocks[b].size())
      fail("KV block " + std::to_string(b), std::to_string(at) + " bytes", std::to_string(blocks[b].size()));
  }
  v.length = int64_t(blocks.size()) * block_tokens;
  if (!tail) return v;

  Reader r{*tail};
  const int64_t length = r.i64();
  if (length / block_tokens != int64_t(blocks.size()))
    fail("KV tail", "a tail continuing " + std::to_string(blocks.size()) + " blocks",
         "one for a sequence of " + std::to_string(length) + " tokens");
  v.length = length;
  v.decoder_window_floor = r.i64();
  v.encoder_window_floor = r.i64();
  const int rings = c.has_dspark() ? c.n_total_layers() : c.n_layers;
  for (int l = 0; l < rings; ++l) v.window.push_back(r.blob());
  for (int s : c.kv_source_layers) {
    StateView::Compressed& cache = v.compressed.at(s);
    const size_t extra = r.count(entry_bytes(c) + key_bytes(c));
    cache.kv.push_back(r.take(extra * entry_bytes(c)));
    cache.index_k.push_back(r.take(extra * key_bytes(c)));
    cache.entries += int64_t(extra);
    cache.pending = int(r.i64());
    cache.pending_kv = r.floats();
    cache.pending_score = r.floats();
  }
  if (r.at != tail->size()) fail("KV tail", std::to_string(r.at) + " bytes", std::to_string(tail->size()));
  check_view(c, v);
  return v;
}

SequenceState restore_sequence(const Config& c, std::span<const Bytes> blocks, int block_tokens, const std::vector<uint8_t>* tail) {
  return materialize(c, view_sequence(c, blocks, block_tokens, tail));
}

}  // namespace dsv41
