// A persistent-store block file: decode_block either returns a block whose every check passed or
// nothing. The input is taken as a whole file, and also used to build a valid block (its first
// bytes as tokens and payload) that the rest of the input then damages byte by byte: a damaged
// block must never decode, an undamaged one must round-trip.
#include <cstring>

#include "fuzz_util.h"
#include "kv/block_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr std::string_view kFingerprint = "fuzz-model/kv-v1";
  const dsv41::BlockKey key{0x0123456789abcdefull, 0xfedcba9876543210ull};
  (void)dsv41::decode_block({data, size}, kFingerprint, key);

  const size_t half = size / 2;
  std::vector<int32_t> tokens(half / 8);
  if (!tokens.empty()) std::memcpy(tokens.data(), data, tokens.size() * sizeof(int32_t));
  const std::span<const uint8_t> payload(data + tokens.size() * sizeof(int32_t), half - tokens.size() * sizeof(int32_t));
  const dsv41::EncodedBlock block = dsv41::encode_block(key, 1000, kFingerprint, tokens, payload);
  std::vector<uint8_t> file(block.header);
  file.insert(file.end(), block.payload.begin(), block.payload.end());
  file.insert(file.end(), block.trailer, block.trailer + 8);
  const std::vector<uint8_t> intact = file;
  for (size_t i = half; i + 1 < size; i += 2) {
    const size_t at = (size_t(data[i]) << 8 | data[i + 1]) % file.size();
    file[at] ^= uint8_t(data[i] ^ data[i + 1]) | 1;
  }
  const bool damaged = file != intact;  // two flips of one byte may undo each other
  const std::optional<dsv41::DecodedBlock> decoded = dsv41::decode_block(file, kFingerprint, key);
  if (damaged && decoded) __builtin_trap();  // a damaged block decoded: the checksums missed it
  if (!damaged && (!decoded || decoded->tokens != tokens)) __builtin_trap();
  return 0;
}
