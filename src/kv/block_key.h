#pragma once
// The identity of one global-KV prefix block: the 128-bit XXH3 hash of the chained prefix
// hash (see DESIGN §4). Every KV tier (host cache, persistent store) is keyed by it.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace dsv41 {

struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
};

// 32 lowercase hex digits, hi first: the key's spelling in file names and messages.
std::string to_hex(const BlockKey& key);

}  // namespace dsv41

template <>
struct std::hash<dsv41::BlockKey> {
  // The key is already a uniform hash; its low word is a good bucket index as it is.
  size_t operator()(const dsv41::BlockKey& key) const noexcept { return static_cast<size_t>(key.lo); }
};
