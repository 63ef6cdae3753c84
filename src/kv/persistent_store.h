#pragma once
// The persistent store: global-KV prefix blocks on disk (DESIGN §4), one self-describing file per
// block (kv/block_file.h), under a guaranteed-lifetime policy.
//
// Policy. A block younger than the lifetime (default 72 h, from its creation) is never evicted.
// A write that does not fit the byte budget evicts blocks older than the lifetime, least
// recently used first, until it fits; when even evicting all of them would not make room, the
// write is refused and counted, and nothing is evicted.
//
// Crash safety. Files are written to a temporary name, fsynced and renamed (see
// write_file_atomically), and carry checksums; opening a store scans its directory, removes
// temporary leftovers and drops (deletes) every block file that is damaged or written under
// another fingerprint. A damaged payload is found by the checksum when the block is read, and is
// dropped then. docs/kv-store.md has the format and the argument.
//
// Several engines may share a store directory (a shared filesystem in production; each holds the
// directory's lock shared): a block is written under a temporary name of its writer's own and
// renamed into place (a reader sees a whole file or none; two engines writing one block leave
// one file, whichever rename came last, with the same tokens and payload); a block another engine
// wrote since this one scanned the directory is found on disk on a miss and indexed then; eviction
// reads each block's creation time from its file, so the guaranteed lifetime holds whoever wrote
// it, and each engine keeps the byte budget over the blocks it has indexed. Temporary files are
// removed at open only when their writer is gone (docs/kv-store.md). Within a process every method
// is thread-safe, and file I/O runs outside the lock.
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/block_file.h"
#include "kv/block_key.h"
#include "kv/clock.h"

namespace dsv41 {

// A store directory's owner: an advisory lock (flock on DIR/LOCK) held while this lives, so that
// one process at a time owns the directory. PersistentStore takes it, or adopts one taken before
// (the server takes it before it listens: a second server on the directory fails before it says
// it is listening). Creates the directory (0700) if missing; throws if another opener holds it.
class StoreLock {
 public:
  explicit StoreLock(const std::string& dir);
  ~StoreLock();
  StoreLock(const StoreLock&) = delete;
  StoreLock& operator=(const StoreLock&) = delete;

 private:
  int fd_ = -1;
};

struct PersistentStoreOptions {
  std::string dir;  // created if missing
  // Names everything that decides the payload's meaning (model, config, quantization, KV
  // formats). A block written under another fingerprint is foreign: dropped, never served.
  std::string fingerprint;
  uint64_t budget_bytes = 0;  // on block files' sizes (header + tokens + payload + checksum)
  int64_t lifetime_ms = 72LL * 3600 * 1000;
  const Clock* clock = &SystemClock::instance();
  // The shape every block of this fingerprint has (0: any): a block of another shape, its
  // checksums right or not, is damaged: dropped at open, never served (one with a payload of the
  // wrong length used to fail every request with its prefix, forever).
  uint64_t payload_bytes = 0;
  uint32_t token_count = 0;
  std::shared_ptr<StoreLock> lock;  // dir's lock, if taken already (else the store takes it)
};

struct PersistentStoreStats {
  uint64_t blocks = 0;
  uint64_t bytes = 0;
  int64_t oldest_age_ms = 0;  // age of the oldest block by creation; 0 when empty
  uint64_t hits = 0;
  uint64_t misses = 0;      // includes collisions and blocks dropped when read
  uint64_t collisions = 0;  // the key was present with other tokens
  uint64_t refused_writes = 0;
  uint64_t evictions = 0;
  uint64_t dropped_files = 0;       // corrupt or foreign block files deleted (at open or when read)
  uint64_t removed_temp_files = 0;  // leftovers of writes interrupted by a crash, deleted at open
};

enum class PutResult {
  kStored,
  kPresent,  // the key is stored already (or being stored by another thread): nothing written
  kRefused,  // no room without evicting young blocks: nothing written or evicted
};

class PersistentStore {
 public:
  // Opens (creating if needed) the store and rebuilds its index by scanning the directory.
  // Throws dsv41::Error if the directory cannot be used or another process has it open.
  explicit PersistentStore(PersistentStoreOptions options);
  ~PersistentStore();
  PersistentStore(const PersistentStore&) = delete;
  PersistentStore& operator=(const PersistentStore&) = delete;

  // Stores a block. Throws dsv41::Error when the file cannot be written (disk full, I/O error).
  PutResult put(const BlockKey& key, std::span<const int32_t> tokens, std::span<const uint8_t> payload);

  // The payload of the block stored under `key` if its tokens equal `tokens`; a hit makes the
  // block the most recently used. A block whose file turns out damaged is dropped, and missed.
  std::optional<std::vector<uint8_t>> get(const BlockKey& key, std::span<const int32_t> tokens);

  bool contains(const BlockKey& key) const;
  PersistentStoreStats stats() const;

  // Where the block with this key lives: <dir>/<first two hex digits>/<32 hex digits>.blk.
  std::string path_of(const BlockKey& key) const;

 private:
  struct Entry {
    uint64_t file_bytes;
    int64_t created_ms;
    // Which file this entry describes: a reader that found the file damaged drops the entry
    // only if it has not been replaced meanwhile by a new write of the same key.
    uint64_t generation;
    std::list<BlockKey>::iterator lru;  // position in lru_
  };

  void scan();
  bool shaped_right(const BlockHeader& header) const;
  bool adopt(const BlockKey& key);
  void insert_locked(const BlockKey& key, uint64_t file_bytes, int64_t created_ms);
  void erase_locked(const BlockKey& key);

  PersistentStoreOptions options_;  // its lock held while the store lives

  mutable std::mutex mutex_;
  std::unordered_map<BlockKey, Entry> index_;
  std::list<BlockKey> lru_;  // most recently used first
  std::unordered_set<BlockKey> writing_;  // keys whose files are being written outside the lock
  uint64_t bytes_ = 0;     // of indexed blocks
  uint64_t reserved_ = 0;  // of blocks being written
  uint64_t next_generation_ = 0;
  PersistentStoreStats counters_;  // the counting fields; the rest is computed by stats()
};

}  // namespace dsv41
