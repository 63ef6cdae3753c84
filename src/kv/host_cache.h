#pragma once
// The host global-KV cache (DESIGN §4): prefix blocks of global KV kept in host DRAM between the
// device and the persistent store, bounded by bytes and evicted least recently used.
//
// A block is stored with its tokens, and a lookup must present the tokens it expects: a key that
// matches with other tokens is a hash collision, counted and answered as a miss, never served.
// The payload is opaque here (the caller's encoding of the block's compressed KV).
//
// All members are safe to call from several threads at once. get() hands out shared, immutable
// blocks, so a block evicted while a reader still copies it stays alive until that reader is done.
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_key.h"

namespace dsv41 {

// Total RAM of this host: MemTotal of /proc/meminfo, else the physical pages sysconf reports.
int64_t host_ram_bytes();
// The default budget of a DRAM tier: 10% of RAM (DESIGN §4).
int64_t default_dram_budget_bytes();

struct HostBlock {
  BlockKey key;
  std::vector<int> tokens;
  std::vector<uint8_t> payload;
  // What the block counts against the budget: its tokens and its payload.
  int64_t bytes() const { return int64_t(tokens.size() * sizeof(int) + payload.size()); }
};

struct HostCacheStats {
  int64_t blocks = 0, bytes = 0;  // held now
  int64_t hits = 0, misses = 0;   // misses include collisions
  int64_t evictions = 0;          // blocks dropped to make room
  int64_t collisions = 0;         // a key found with other tokens (by get or by put)
  int64_t refused = 0;            // puts of a block larger than the whole budget
};

class HostCache {
 public:
  explicit HostCache(int64_t budget_bytes = default_dram_budget_bytes());

  // Stores a block (replacing any block under the same key) as the most recently used, evicting
  // from the least recently used end until it fits. A block larger than the budget is refused:
  // returns false and counts it, leaving the cache as it was. The cache shares the block given.
  bool put(std::shared_ptr<const HostBlock> block);
  // The block under `key` if it holds exactly `tokens` (and marks it most recently used); else null.
  std::shared_ptr<const HostBlock> get(const BlockKey& key, std::span<const int> tokens);

  int64_t budget_bytes() const { return budget_; }
  HostCacheStats stats() const;

 private:
  using Lru = std::list<std::shared_ptr<const HostBlock>>;  // front = most recently used
  void erase(Lru::iterator it);

  const int64_t budget_;
  mutable std::mutex mutex_;
  Lru lru_;
  std::unordered_map<BlockKey, Lru::iterator> index_;
  HostCacheStats stats_;
};

}  // namespace dsv41
