#pragma once
// The KV tiers behind one door (DESIGN §4): the host global-KV cache, the persistent store on disk
// and the SWA pool, addressed by the prefix keys of one model. A prompt's global blocks are looked
// up host first, then disk (a disk hit is copied up to the host); a sequence's tail at an exact
// position is looked up in the SWA pool. What to adopt from a lookup is the engine's decision
// (engine/session.h); this class only finds and stores.
//
// One KvCache serves one model in one mode: the mode is part of the fingerprint, so exact-mode
// sequences only ever see KV that exact-mode runs produced (default mode's encoder replay makes
// global KV that differs slightly from a cold run's, which exact mode must never read).
//
// Thread-safe: every tier is. Writes to the persistent store (a file and an fsync per block) run
// on a writer thread of the cache's own, so that storing a long prompt's blocks does not stall the
// engine's loop; a block is in the host cache before its write is queued, so nothing is served
// later for it. The destructor writes what is queued.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "forward/sequence_state.h"
#include "forward/state_view.h"
#include "kv/host_cache.h"
#include "kv/persistent_store.h"
#include "kv/prefix_key.h"
#include "kv/swa_pool.h"

namespace dsv41 {

struct KvCacheOptions {
  std::string fingerprint;  // the checkpoint's identity; mixed into every key
  std::string mode;         // the inference mode of the sequences it serves; likewise
  int block_tokens = 0;     // 0 = block_tokens(config)
  int64_t host_budget_bytes = default_dram_budget_bytes();
  SwaPoolOptions swa;
  std::string store_dir;             // empty = no persistent store
  std::shared_ptr<StoreLock> store_lock;  // store_dir's lock, if its owner took it already
  uint64_t store_budget_bytes = 64ull << 30;
  int64_t store_lifetime_ms = 72LL * 3600 * 1000;
  const Clock* clock = &SystemClock::instance();  // the store's; the pool has its own in `swa`
};

// Tokens served per tier and the work the cache saved or cost, cumulative (what /metrics shows).
struct KvCacheCounters {
  int64_t device_tokens = 0;  // continued from a running sequence's own state
  int64_t host_tokens = 0;    // global KV from host-cache blocks
  int64_t disk_tokens = 0;    // global KV from persistent-store blocks
  int64_t swa_tokens = 0;     // positions continued exactly from an SWA-pool tail
  int64_t replayed_tokens = 0;  // rows rerun to regenerate SWA KV (a replay)
  double replay_seconds = 0;    // wall time of the prefill calls that replayed
  int64_t short_hits = 0;       // global hits not adopted: no longer than the window
  int64_t store_errors = 0;     // blocks the persistent store failed to write (disk full, I/O)
  double store_read_seconds = 0;  // wall time reading prompt blocks from the store (part of a lookup)
};

struct KvCacheStats {
  HostCacheStats host;
  SwaPoolStats swa;
  std::optional<PersistentStoreStats> store;
  KvCacheCounters counters;
};

// The run of a prompt's blocks found from its start: the host cache's own blocks, shared (no copy).
struct BlockRun {
  std::vector<std::shared_ptr<const HostBlock>> blocks;  // in order
  std::vector<bool> from_disk;  // per block: found in the store, not the host cache
  std::vector<BlockKey> keys;   // per block: its key
  int64_t tokens(int block_tokens) const { return int64_t(blocks.size()) * block_tokens; }
  // The first n blocks' payloads, as view_sequence takes them.
  std::vector<Bytes> payloads(size_t n) const {
    std::vector<Bytes> out;
    for (size_t b = 0; b < n && b < blocks.size(); ++b) out.emplace_back(blocks[b]->payload);
    return out;
  }
};

class KvCache {
 public:
  KvCache(const Config& config, KvCacheOptions options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const Config& config() const { return config_; }
  const std::string& mode() const { return mode_; }
  const PrefixKeys& keys() const { return keys_; }
  int block_tokens() const { return keys_.block_tokens(); }

  // Every method takes the prompt's tokens and its images (PrefixKeys: their spans and content
  // hashes are in the keys of the blocks they overlap), by start.

  // The blocks of `tokens` found from the start (at most max_blocks), host first, then disk; the
  // run stops at the first block found in neither.
  BlockRun find_blocks(std::span<const int> tokens, int64_t max_blocks, std::span<const ImageSpanKey> images = {});
  // The live SWA-pool tail at the latest position in [lo, hi] of `tokens`, if any. `block_keys`
  // are the keys of its first blocks (a BlockRun's), at least every complete block below hi.
  struct TailHit {
    int64_t position;
    std::shared_ptr<const SwaSnapshot> snapshot;
  };
  std::optional<TailHit> find_tail(std::span<const int> tokens, std::span<const BlockKey> block_keys, int64_t lo,
                                   int64_t hi, std::span<const ImageSpanKey> images = {});

  // Stores blocks [first_block, state.length / B) of a state holding `tokens`, in the host cache
  // and, queued for the writer, the persistent store (a block the store holds already is not
  // rewritten). A write the store fails (disk full, I/O error) is counted and skipped: serving goes
  // on without it. Waits only when kMaxQueuedWrites blocks are queued already.
  void store_blocks(std::span<const int> tokens, const StateView& state, int64_t first_block,
                    std::span<const ImageSpanKey> images = {});
  // Returns once every store write queued so far is done (written, present, refused or failed),
  // and every SWA-pool put is where other engines find it.
  void flush();
  static constexpr size_t kMaxQueuedWrites = 4096;
  // Stores the state's tail in the SWA pool at its position.
  void store_tail(std::span<const int> tokens, const StateView& state, std::span<const ImageSpanKey> images = {});

  // The engine's tally (counters are added to, never reset).
  void count(const KvCacheCounters& delta);
  KvCacheStats stats() const;

 private:
  const Config config_;
  const std::string mode_;
  PrefixKeys keys_;
  HostCache host_;
  std::unique_ptr<SwaTier> swa_;
  std::unique_ptr<PersistentStore> store_;
  mutable std::mutex mutex_;
  KvCacheCounters counters_;

  // The writer: blocks queued for the store, taken in order; `writing_` while one is in hand.
  void write_loop();
  std::mutex write_mutex_;
  std::condition_variable queued_, written_;
  std::deque<std::shared_ptr<const HostBlock>> writes_;
  bool writing_ = false;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace dsv41
