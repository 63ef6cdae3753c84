#pragma once
// The on-disk format of one persistent-store block: a self-describing, versioned file that
// carries its own key, fingerprint, creation time, tokens and payload, with checksums. The byte
// layout is in docs/kv-store.md; this file is the only code that knows it.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kv/block_key.h"

namespace dsv41 {

// The fixed part of the header; the fingerprint, the tokens and zero padding to 8 bytes follow.
inline constexpr size_t kBlockFixedHeaderBytes = 64;
inline constexpr uint32_t kBlockFormatVersion = 1;
// Bounds that no valid block exceeds; they keep a damaged header from asking for gigabytes.
inline constexpr uint32_t kMaxFingerprintBytes = 4096;
inline constexpr uint32_t kMaxBlockTokens = 1u << 20;

// What the header says about a block.
struct BlockHeader {
  BlockKey key;
  int64_t created_ms = 0;
  uint64_t payload_bytes = 0;
  uint32_t fingerprint_bytes = 0;
  uint32_t token_count = 0;
  uint32_t header_bytes = 0;  // fixed part + fingerprint + tokens + padding: where the payload starts

  // The size of the whole file: header, payload and the 8-byte checksum trailer.
  uint64_t file_bytes() const { return header_bytes + payload_bytes + 8; }
};

// The size of the file of a block with these contents.
uint64_t block_file_bytes(size_t fingerprint_bytes, size_t token_count, size_t payload_bytes);

// The bytes of a block file, as parts to be written one after another: the header, the payload
// (not copied) and the checksum trailer.
struct EncodedBlock {
  std::vector<uint8_t> header;
  std::span<const uint8_t> payload;
  uint8_t trailer[8];
};
EncodedBlock encode_block(const BlockKey& key, int64_t created_ms, std::string_view fingerprint,
                          std::span<const int32_t> tokens, std::span<const uint8_t> payload);

// Reads the header of the block file open on `fd` (whose size is `file_bytes`) and checks all
// that can be checked without reading the payload: magic, version, header checksum, sizes
// consistent with the file's, and the fingerprint. Nothing when any check fails.
std::optional<BlockHeader> read_block_header(int fd, uint64_t file_bytes, std::string_view fingerprint);

// A whole block file, fully checked (every header check, the key, and the checksum over all
// bytes); the spans point into the bytes given to decode_block.
struct DecodedBlock {
  BlockHeader header;
  std::vector<int32_t> tokens;
  std::span<const uint8_t> payload;
};
std::optional<DecodedBlock> decode_block(std::span<const uint8_t> file, std::string_view fingerprint,
                                         const BlockKey& key);

}  // namespace dsv41
