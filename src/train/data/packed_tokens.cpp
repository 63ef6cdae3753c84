#include "train/data/packed_tokens.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "base/error.h"

namespace dsv41::train {

namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', '1', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 48;

void store(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = uint8_t(v >> (8 * i));
}
uint64_t load(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

// SplitMix64 (Steele, Lea and Flood 2014): the shuffle's random numbers, the same everywhere.
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

PackedTokenWriter::PackedTokenWriter(std::string path, uint32_t vocab_size, uint32_t eos_id)
    : path_(std::move(path)), partial_(path_ + ".partial"), vocab_size_(vocab_size), eos_id_(eos_id),
      width_(vocab_size <= 65536 ? 2 : 4), hash_(XXH3_createState(), &XXH3_freeState) {
  if (eos_id >= vocab_size) fail(path_, "an EOS id below the vocabulary size " + std::to_string(vocab_size), std::to_string(eos_id));
  XXH3_64bits_reset(hash_.get());
  out_.open(partial_, std::ios::binary | std::ios::trunc);
  if (!out_) fail(partial_, "a file we can write", "an error opening it");
  const std::vector<char> header(kHeaderBytes, 0);  // written for real by finish()
  out_.write(header.data(), std::streamsize(header.size()));
}

void PackedTokenWriter::append(uint32_t id) {
  if (id >= vocab_size_) fail(path_, "token ids below " + std::to_string(vocab_size_), std::to_string(id));
  const size_t at = buffer_.size();
  buffer_.resize(at + width_);
  store(buffer_.data() + at, id, int(width_));
  ++tokens_;
}

void PackedTokenWriter::add_document(std::span<const int> ids) {
  for (int id : ids) {
    if (id < 0) fail(path_, "token ids of at least 0", std::to_string(id));
    append(uint32_t(id));
  }
  append(eos_id_);
  ++documents_;
  if (buffer_.size() >= (1u << 20)) {
    XXH3_64bits_update(hash_.get(), buffer_.data(), buffer_.size());
    out_.write(reinterpret_cast<const char*>(buffer_.data()), std::streamsize(buffer_.size()));
    buffer_.clear();
  }
}

void PackedTokenWriter::finish() {
  XXH3_64bits_update(hash_.get(), buffer_.data(), buffer_.size());
  out_.write(reinterpret_cast<const char*>(buffer_.data()), std::streamsize(buffer_.size()));
  buffer_.clear();
  uint8_t h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  store(h + 8, kVersion, 4);
  store(h + 12, width_, 4);
  store(h + 16, vocab_size_, 4);
  store(h + 20, eos_id_, 4);
  store(h + 24, tokens_, 8);
  store(h + 32, documents_, 8);
  store(h + 40, XXH3_64bits_digest(hash_.get()), 8);
  out_.seekp(0);
  out_.write(reinterpret_cast<const char*>(h), kHeaderBytes);
  out_.close();
  if (!out_) fail(partial_, "a complete write", "an error");
  std::filesystem::rename(partial_, path_);
}

PackedTokens PackedTokens::read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "a packed token file", "no readable file");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0)
    fail(path, "a packed token file (magic DSV41TOK)", "other data");
  const uint8_t* h = bytes.data();
  if (load(h + 8, 4) != kVersion) fail(path, "version 1", "version " + std::to_string(load(h + 8, 4)));
  const uint64_t width = load(h + 12, 4), count = load(h + 24, 8);
  if (width != 2 && width != 4) fail(path, "2 or 4 bytes per token", std::to_string(width));
  if (bytes.size() - kHeaderBytes != count * width)
    fail(path, std::to_string(count) + " tokens of " + std::to_string(width) + " bytes after the header",
         std::to_string(bytes.size() - kHeaderBytes) + " bytes");
  const uint8_t* data = h + kHeaderBytes;
  if (XXH3_64bits(data, count * width) != load(h + 40, 8)) fail(path, "tokens that match the header's checksum", "other bytes");
  PackedTokens t;
  t.vocab_size_ = uint32_t(load(h + 16, 4));
  t.eos_id_ = uint32_t(load(h + 20, 4));
  t.documents_ = load(h + 32, 8);
  t.tokens_.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    t.tokens_[i] = uint32_t(load(data + i * width, int(width)));
    if (t.tokens_[i] >= t.vocab_size_)
      fail(path, "token ids below " + std::to_string(t.vocab_size_), std::to_string(t.tokens_[i]) + " at token " + std::to_string(i));
  }
  return t;
}

SequenceIterator::SequenceIterator(const PackedTokens& tokens, uint64_t length, uint64_t seed, uint64_t position)
    : tokens_(tokens), length_(length), seed_(seed),
      count_(length > 0 && tokens.size() > 0 ? (tokens.size() - 1) / length : 0), position_(position) {
  if (length == 0 || count_ == 0)
    fail("packed tokens", "at least one sequence of " + std::to_string(length) + " + 1 tokens",
         std::to_string(tokens.size()) + " tokens");
}

std::span<const uint32_t> SequenceIterator::sequence(uint64_t k) const {
  if (k >= count_) fail("sequence " + std::to_string(k), "an index below " + std::to_string(count_), std::to_string(k));
  return tokens_.tokens().subspan(k * length_, length_ + 1);
}

void SequenceIterator::draw_epoch(uint64_t epoch) {
  // Fisher-Yates over the sequence indices; j uniform in [0, i] by multiply-shift of a 64-bit
  // draw (bias below 2^-40 for any file that fits in memory).
  order_.resize(count_);
  for (uint64_t i = 0; i < count_; ++i) order_[i] = i;
  uint64_t state = seed_ ^ (epoch * 0xD1B54A32D192ED03ull);
  for (uint64_t i = count_ - 1; i > 0; --i) {
    const uint64_t j = uint64_t((static_cast<unsigned __int128>(splitmix64(state)) * (i + 1)) >> 64);
    std::swap(order_[i], order_[j]);
  }
  order_epoch_ = epoch;
}

std::span<const uint32_t> SequenceIterator::next() {
  const uint64_t epoch = position_ / count_;
  if (epoch != order_epoch_) draw_epoch(epoch);
  return sequence(order_[position_++ % count_]);
}

}  // namespace dsv41::train
