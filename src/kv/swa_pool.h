#pragma once
// The SWA pool (DESIGN §4): snapshots of a sequence's sliding-window KV, taken at two points of
// every turn (the end of the prompt and the end of the output), kept in host DRAM for a short time
// so that the next turn of the same conversation continues exactly instead of replaying the
// encoder over the last W positions (DESIGN §3). Never written to disk: a snapshot is ~2.8 MB for
// V4.1-Flash and worth keeping only while a user is likely to come back.
//
// An entry is keyed by the prefix it ends (PrefixKeys::prefix_key of all its tokens) and by its
// exact position (the token count), and holds one opaque byte string: the sequence's tail
// (kv/sequence_blocks.h: every layer's SWA ring, the global KV of the incomplete last block, the
// compressor's open groups, the replay floors), all a sequence needs beyond its global blocks.
//
// The engine sees the pool through SwaTier: this file's SwaPool keeps the tails in this process;
// MemcachedSwaPool (memcached_swa_pool.h) on memcached servers that several engines share.
//
// The in-process pool's policies (docs/kv-tiers.md):
//  * TTL from the last use: put and every hit set an entry's expiry to now + ttl. An expired entry
//    is never served, and its space is released before any live entry is evicted. Expiry is
//    checked at every put and get, so expired space is reused at once.
//  * A byte budget; when a put does not fit after releasing the expired, live entries are evicted
//    least recently used first. An entry larger than the whole budget is refused and counted.
// Since the TTL runs from the last use, least recently used is also soonest to expire: the expired
// entries are always the tail of the LRU list, and releasing them costs only what is released.
//
// All members are safe to call from several threads at once.
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/block_key.h"
#include "kv/clock.h"
#include "kv/host_cache.h"  // default_dram_budget_bytes

namespace dsv41 {

struct SwaSnapshot {
  std::vector<uint8_t> tail;
  int64_t bytes() const { return int64_t(tail.size()); }
};

struct SwaPoolStats {
  int64_t entries = 0, bytes = 0;  // held now (expired ones included until the next put or get)
  int64_t hits = 0, misses = 0;    // misses include gets of an expired entry
  int64_t ttl_expiries = 0;        // entries released because their TTL ran out
  int64_t evictions = 0;           // live entries dropped to make room
  int64_t refused = 0;             // puts of an entry larger than the whole budget
  // A pool on memcached servers (memcached_swa_pool.h), whose entries, expiries and evictions
  // are the servers' own: the traffic, and what did not come back whole.
  int64_t bytes_written = 0, bytes_read = 0;
  int64_t server_errors = 0;  // operations the servers refused or failed as a whole (a server that
                              // dies during a fetch shows as misses only)
  int64_t torn = 0;           // tails found with a chunk missing, of the wrong size or checksum: misses
};

struct SwaPoolOptions {
  int64_t budget_bytes = default_dram_budget_bytes();  // 10% of RAM (in-process only)
  int64_t ttl_ms = 5 * 60 * 1000;                      // 5 minutes
  const Clock* clock = &SystemClock::instance();       // tests inject a ManualClock (in-process only)
  // Where the tails live: empty for this process's memory (SwaPool), or memcached servers,
  // "memcached://host:port,host:port" (MemcachedSwaPool).
  std::string url{};
};

// What the engine asks of the SWA pool, wherever its tails live.
class SwaTier {
 public:
  virtual ~SwaTier() = default;
  // Stores the snapshot at (prefix, position), replacing any entry there, with a fresh TTL.
  // Returns false (and counts it) if it was not stored.
  virtual bool put(const BlockKey& prefix, int64_t position, SwaSnapshot snapshot) = 0;
  // The first live snapshot among `candidates` (prefix, position), tried in the order given: one
  // lookup of a prompt over the positions it could continue from, counted as one hit or one miss.
  // Returns the index of the candidate found and its snapshot (TTL renewed), or nothing.
  struct Found {
    size_t index;
    std::shared_ptr<const SwaSnapshot> snapshot;
  };
  virtual std::optional<Found> get_first(std::span<const std::pair<BlockKey, int64_t>> candidates) = 0;
  // Returns once every put made so far is where gets on other engines find it.
  virtual void flush() = 0;
  virtual int64_t ttl_ms() const = 0;
  virtual SwaPoolStats stats() const = 0;
};

// The pool options.url names: this process's SwaPool, or a MemcachedSwaPool.
std::unique_ptr<SwaTier> make_swa_tier(const SwaPoolOptions& options);

// The in-process pool.
class SwaPool final : public SwaTier {
 public:
  explicit SwaPool(SwaPoolOptions options = {});

  // put: as the most recently used; false if it is larger than the budget.
  bool put(const BlockKey& prefix, int64_t position, SwaSnapshot snapshot) override;
  // The live snapshot at (prefix, position), its TTL renewed; null if absent or expired.
  std::shared_ptr<const SwaSnapshot> get(const BlockKey& prefix, int64_t position);
  std::optional<Found> get_first(std::span<const std::pair<BlockKey, int64_t>> candidates) override;
  // Releases every expired entry now; returns how many. put and get do this themselves; a server
  // may also call it from a timer so that idle memory is returned without waiting for traffic.
  int64_t release_expired();

  void flush() override {}  // puts are in place when they return
  int64_t budget_bytes() const { return options_.budget_bytes; }
  int64_t ttl_ms() const override { return options_.ttl_ms; }
  SwaPoolStats stats() const override;

 private:
  struct Slot {
    BlockKey prefix;
    int64_t position = 0;
    friend bool operator==(const Slot&, const Slot&) = default;
  };
  struct SlotHash {
    size_t operator()(const Slot& s) const noexcept {
      return std::hash<BlockKey>()(s.prefix) ^ (size_t(s.position) * 0x9e3779b97f4a7c15ull);
    }
  };
  struct Entry {
    Slot slot;
    std::shared_ptr<const SwaSnapshot> snapshot;
    int64_t expires_ms = 0;
  };
  using Lru = std::list<Entry>;  // front = most recently used = latest expiry

  // The clock, never allowed to run backwards here: a step back of the wall clock would otherwise
  // put a fresh entry's expiry before an older one's and break the LRU tail = soonest expiry order.
  int64_t now_ms();
  int64_t release_expired_locked(int64_t now);
  void erase(Lru::iterator it);

  const SwaPoolOptions options_;
  mutable std::mutex mutex_;
  int64_t latest_ms_;
  Lru lru_;
  std::unordered_map<Slot, Lru::iterator, SlotHash> index_;
  SwaPoolStats stats_;
};

}  // namespace dsv41
