#include "kv/block_file.h"

#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

namespace dsv41 {
namespace {

// "DSV41KVB": a file that does not start with it is not a block of ours.
constexpr uint8_t kMagic[8] = {'D', 'S', 'V', '4', '1', 'K', 'V', 'B'};

// Offsets in the fixed header (docs/kv-store.md).
constexpr size_t kVersionAt = 8, kHeaderBytesAt = 12, kKeyHiAt = 16, kKeyLoAt = 24, kCreatedAt = 32,
                 kPayloadBytesAt = 40, kFingerprintBytesAt = 48, kTokenCountAt = 52, kHeaderChecksumAt = 56;

// Fields are little-endian whatever the host, so that a store directory moves between machines.
void store_le(uint8_t* at, uint64_t value, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) at[i] = static_cast<uint8_t>(value >> (8 * i));
}
uint64_t load_le(const uint8_t* at, size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) value |= uint64_t(at[i]) << (8 * i);
  return value;
}

uint64_t header_bytes_for(uint64_t fingerprint_bytes, uint64_t token_count) {
  const uint64_t unpadded = kBlockFixedHeaderBytes + fingerprint_bytes + 4 * token_count;
  return (unpadded + 7) / 8 * 8;  // the payload starts 8-byte aligned
}

// Checks the fixed header against itself and against the file's size. The header checksum
// comes first: it guards the creation time and sizes, which the index trusts without reading
// the rest of the file (a damaged creation time could otherwise pin a block as young forever).
std::optional<BlockHeader> parse_fixed_header(const uint8_t* fixed, uint64_t file_bytes) {
  if (std::memcmp(fixed, kMagic, sizeof kMagic) != 0) return std::nullopt;
  if (load_le(fixed + kVersionAt, 4) != kBlockFormatVersion) return std::nullopt;
  if (load_le(fixed + kHeaderChecksumAt, 8) != XXH3_64bits(fixed, kHeaderChecksumAt)) return std::nullopt;
  BlockHeader header;
  header.key = BlockKey{load_le(fixed + kKeyHiAt, 8), load_le(fixed + kKeyLoAt, 8)};
  header.created_ms = static_cast<int64_t>(load_le(fixed + kCreatedAt, 8));
  header.payload_bytes = load_le(fixed + kPayloadBytesAt, 8);
  header.fingerprint_bytes = static_cast<uint32_t>(load_le(fixed + kFingerprintBytesAt, 4));
  header.token_count = static_cast<uint32_t>(load_le(fixed + kTokenCountAt, 4));
  header.header_bytes = static_cast<uint32_t>(load_le(fixed + kHeaderBytesAt, 4));
  if (header.fingerprint_bytes > kMaxFingerprintBytes || header.token_count > kMaxBlockTokens) return std::nullopt;
  if (header.header_bytes != header_bytes_for(header.fingerprint_bytes, header.token_count)) return std::nullopt;
  // Compared without forming header_bytes + payload_bytes, which a foreign value could overflow.
  if (file_bytes < header.header_bytes + 8 || header.payload_bytes != file_bytes - header.header_bytes - 8)
    return std::nullopt;
  return header;
}

// Reads exactly `bytes` at `offset`; false on a short read or an error.
bool read_at(int fd, uint8_t* into, size_t bytes, uint64_t offset) {
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, into, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    into += got;
    bytes -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

}  // namespace

uint64_t block_file_bytes(size_t fingerprint_bytes, size_t token_count, size_t payload_bytes) {
  return header_bytes_for(fingerprint_bytes, token_count) + payload_bytes + 8;
}

EncodedBlock encode_block(const BlockKey& key, int64_t created_ms, std::string_view fingerprint,
                          std::span<const int32_t> tokens, std::span<const uint8_t> payload) {
  EncodedBlock block;
  block.header.assign(header_bytes_for(fingerprint.size(), tokens.size()), 0);
  uint8_t* h = block.header.data();
  std::memcpy(h, kMagic, sizeof kMagic);
  store_le(h + kVersionAt, kBlockFormatVersion, 4);
  store_le(h + kHeaderBytesAt, block.header.size(), 4);
  store_le(h + kKeyHiAt, key.hi, 8);
  store_le(h + kKeyLoAt, key.lo, 8);
  store_le(h + kCreatedAt, static_cast<uint64_t>(created_ms), 8);
  store_le(h + kPayloadBytesAt, payload.size(), 8);
  store_le(h + kFingerprintBytesAt, fingerprint.size(), 4);
  store_le(h + kTokenCountAt, tokens.size(), 4);
  store_le(h + kHeaderChecksumAt, XXH3_64bits(h, kHeaderChecksumAt), 8);
  std::memcpy(h + kBlockFixedHeaderBytes, fingerprint.data(), fingerprint.size());
  uint8_t* token_bytes = h + kBlockFixedHeaderBytes + fingerprint.size();
  for (size_t i = 0; i < tokens.size(); ++i) store_le(token_bytes + 4 * i, static_cast<uint32_t>(tokens[i]), 4);

  // The trailer covers header and payload as one byte string; streaming avoids copying the payload.
  const std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_64bits_reset(state.get());
  XXH3_64bits_update(state.get(), block.header.data(), block.header.size());
  XXH3_64bits_update(state.get(), payload.data(), payload.size());
  store_le(block.trailer, XXH3_64bits_digest(state.get()), 8);
  block.payload = payload;
  return block;
}

std::optional<BlockHeader> read_block_header(int fd, uint64_t file_bytes, std::string_view fingerprint) {
  uint8_t fixed[kBlockFixedHeaderBytes];
  if (file_bytes < kBlockFixedHeaderBytes || !read_at(fd, fixed, sizeof fixed, 0)) return std::nullopt;
  std::optional<BlockHeader> header = parse_fixed_header(fixed, file_bytes);
  if (!header || header->fingerprint_bytes != fingerprint.size()) return std::nullopt;
  std::string stored(fingerprint.size(), '\0');
  if (!read_at(fd, reinterpret_cast<uint8_t*>(stored.data()), stored.size(), kBlockFixedHeaderBytes) ||
      stored != fingerprint)
    return std::nullopt;
  return header;
}

std::optional<DecodedBlock> decode_block(std::span<const uint8_t> file, std::string_view fingerprint,
                                         const BlockKey& key) {
  if (file.size() < kBlockFixedHeaderBytes) return std::nullopt;
  std::optional<BlockHeader> header = parse_fixed_header(file.data(), file.size());
  if (!header || header->key != key || header->fingerprint_bytes != fingerprint.size()) return std::nullopt;
  const size_t body = file.size() - 8;
  if (load_le(file.data() + body, 8) != XXH3_64bits(file.data(), body)) return std::nullopt;
  const uint8_t* stored_fingerprint = file.data() + kBlockFixedHeaderBytes;
  if (std::memcmp(stored_fingerprint, fingerprint.data(), fingerprint.size()) != 0) return std::nullopt;

  DecodedBlock block{*header, std::vector<int32_t>(header->token_count), {}};
  const uint8_t* token_bytes = stored_fingerprint + fingerprint.size();
  for (size_t i = 0; i < block.tokens.size(); ++i)
    block.tokens[i] = static_cast<int32_t>(static_cast<uint32_t>(load_le(token_bytes + 4 * i, 4)));
  block.payload = file.subspan(header->header_bytes, header->payload_bytes);
  return block;
}

}  // namespace dsv41
