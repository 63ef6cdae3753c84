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
  void blob(const std::vector<uint8_t>& v) {
    i64(int64_t(v.size()));
    bytes(v.data(), v.size());
  }
  void floats(const std::vector<float>& v) {
    i64(int64_t(v.size()));
    bytes(v.data(), v.size() * sizeof(float));
  }
};

struct Reader {
  const std::vector<uint8_t>& in;
  size_t at = 0;
  void bytes(void* p, size_t n) {
    if (at + n > in.size()) fail("KV tail", std::to_string(at + n) + " bytes", std::to_string(in.size()));
    if (n) std::memcpy(p, in.data() + at, n);  // an empty field's destination may be null
    at += n;
  }
  int64_t i64() {
    int64_t v;
    bytes(&v, sizeof v);
    return v;
  }
  std::vector<uint8_t> blob() {
    std::vector<uint8_t> v(static_cast<size_t>(i64()));
    bytes(v.data(), v.size());
    return v;
  }
  std::vector<float> floats() {
    std::vector<float> v(static_cast<size_t>(i64()));
    bytes(v.data(), v.size() * sizeof(float));
    return v;
  }
};

}  // namespace

int64_t global_block_bytes(const Config& c, int block_tokens) {
  check_block_tokens(c, block_tokens);
  int64_t bytes = 0;
  for (int s : c.kv_source_layers) bytes += block_tokens / c.compress_ratios[size_t(s)] * int64_t(entry_bytes(c) + key_bytes(c));
  return bytes;
}

std::vector<uint8_t> global_block(const Config& c, const SequenceState& state, int64_t block, int block_tokens) {
  check_block_tokens(c, block_tokens);
  if ((block + 1) * block_tokens > state.length)
    fail("KV block " + std::to_string(block), "a state holding its " + std::to_string(block_tokens) + " tokens",
         std::to_string(state.length) + " tokens");
  std::vector<uint8_t> out;
  for (int s : c.kv_source_layers) {
    const CompressedCache& cache = state.compressed.at(s);
    const int64_t per_block = block_tokens / c.compress_ratios[size_t(s)], first = block * per_block;
    out.insert(out.end(), cache.kv.begin() + first * entry_bytes(c), cache.kv.begin() + (first + per_block) * entry_bytes(c));
    out.insert(out.end(), cache.index_k.begin() + first * key_bytes(c),
               cache.index_k.begin() + (first + per_block) * key_bytes(c));
  }
  return out;
}

std::vector<uint8_t> sequence_tail(const Config& c, const SequenceState& state, int block_tokens) {
  check_block_tokens(c, block_tokens);
  const int64_t blocks = state.length / block_tokens;
  Writer w;
  w.i64(state.length);
  w.i64(state.decoder_window_floor);
  w.i64(state.encoder_window_floor);
  for (const auto& ring : state.window) w.blob(ring);
  for (int s : c.kv_source_layers) {
    const CompressedCache& cache = state.compressed.at(s);
    const int64_t first = blocks * (block_tokens / c.compress_ratios[size_t(s)]);
    w.i64(cache.entries - first);
    w.bytes(cache.kv.data() + first * entry_bytes(c), size_t(cache.entries - first) * entry_bytes(c));
    w.bytes(cache.index_k.data() + first * key_bytes(c), size_t(cache.entries - first) * key_bytes(c));
    w.i64(cache.pending);
    w.floats(cache.pending_kv);
    w.floats(cache.pending_score);
  }
  return std::move(w.out);
}

SequenceState restore_sequence(const Config& c, std::span<const std::span<const uint8_t>> blocks, int block_tokens,
                               const std::vector<uint8_t>* tail) {
  check_block_tokens(c, block_tokens);
  SequenceState state(c);
  // Room for the blocks' entries and a tail's (fewer than one block's).
  for (int s : c.kv_source_layers) {
    CompressedCache& cache = state.compressed.at(s);
    const size_t entries = (blocks.size() + (tail ? 1 : 0)) * size_t(block_tokens / c.compress_ratios[size_t(s)]);
    cache.kv.reserve(entries * entry_bytes(c));
    cache.index_k.reserve(entries * key_bytes(c));
  }
  for (size_t b = 0; b < blocks.size(); ++b) {
    size_t at = 0;
    for (int s : c.kv_source_layers) {
      CompressedCache& cache = state.compressed.at(s);
      const int64_t per_block = block_tokens / c.compress_ratios[size_t(s)];
      const size_t kv = size_t(per_block) * entry_bytes(c), keys = size_t(per_block) * key_bytes(c);
      if (at + kv + keys > blocks[b].size())
        fail("KV block " + std::to_string(b), "at least " + std::to_string(at + kv + keys) + " bytes",
             std::to_string(blocks[b].size()));
      cache.kv.insert(cache.kv.end(), blocks[b].begin() + at, blocks[b].begin() + at + kv);
      cache.index_k.insert(cache.index_k.end(), blocks[b].begin() + at + kv, blocks[b].begin() + at + kv + keys);
      cache.entries += per_block;
      at += kv + keys;
    }
    if (at != blocks[b].size())
      fail("KV block " + std::to_string(b), std::to_string(at) + " bytes", std::to_string(blocks[b].size()));
  }
  state.length = int64_t(blocks.size()) * block_tokens;
  if (!tail) return state;

  Reader r{*tail};
  const int64_t length = r.i64();
  if (length / block_tokens != int64_t(blocks.size()))
    fail("KV tail", "a tail continuing " + std::to_string(blocks.size()) + " blocks",
         "one for a sequence of " + std::to_string(length) + " tokens");
  state.length = length;
  state.decoder_window_floor = r.i64();
  state.encoder_window_floor = r.i64();
  for (auto& ring : state.window) {
    std::vector<uint8_t> bytes = r.blob();
    if (bytes.size() != ring.size()) fail("KV tail", std::to_string(ring.size()) + " ring bytes", std::to_string(bytes.size()));
    ring = std::move(bytes);
  }
  for (int s : c.kv_source_layers) {
    CompressedCache& cache = state.compressed.at(s);
    const int64_t extra = r.i64();
    const size_t kv = size_t(extra) * entry_bytes(c), keys = size_t(extra) * key_bytes(c);
    cache.kv.resize(cache.kv.size() + kv);
    r.bytes(cache.kv.data() + cache.kv.size() - kv, kv);
    cache.index_k.resize(cache.index_k.size() + keys);
    r.bytes(cache.index_k.data() + cache.index_k.size() - keys, keys);
    cache.entries += extra;
    cache.pending = int(r.i64());
    cache.pending_kv = r.floats();
    cache.pending_score = r.floats();
  }
  if (r.at != tail->size()) fail("KV tail", std::to_string(r.at) + " bytes", std::to_string(tail->size()));
  return state;
}

}  // namespace dsv41
