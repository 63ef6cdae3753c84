#include "kv/persistent_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <string_view>
#include <utility>

#include "base/error.h"
#include "base/fd.h"
#include "kv/block_file.h"
#include "model/safetensors.h"

namespace dsv41 {
namespace {

constexpr std::string_view kBlockSuffix = ".blk";
// A block is written to <path>.<pid>.<n>.tmp before its rename: engines sharing the directory
// never write one another's temporary files, and a leftover names the process that left it.
constexpr std::string_view kTempSuffix = ".tmp";
// A temporary file older than this is a leftover whoever wrote it (a block is written in
// milliseconds; a pid that looks alive may be another process's in another pid namespace).
constexpr int64_t kTempLeftoverSeconds = 3600;
constexpr size_t kShards = 256;

std::string errno_text() { return std::strerror(errno); }

// Whether a temporary file is a leftover of a write that will never finish: its writer (the pid
// in its name) is gone, or it is older than kTempLeftoverSeconds, or its name says no writer.
bool temp_leftover(const std::string& name, const std::string& path) {
  const size_t at = name.find(std::string(kBlockSuffix) + ".");
  if (at == std::string::npos) return true;
  const std::string_view rest = std::string_view(name).substr(at + kBlockSuffix.size() + 1);
  long pid = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
  if (ec != std::errc() || end == rest.data() || *end != '.' || pid <= 0) return true;
  if (::kill(pid_t(pid), 0) != 0 && errno == ESRCH) return true;
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return false;  // gone already: renamed by its writer
  return ::time(nullptr) - info.st_mtime > kTempLeftoverSeconds;
}

// A shard is named by the first byte of its keys, as to_hex spells it.
std::string shard_name(size_t shard) {
  constexpr char kDigits[] = "0123456789abcdef";
  return {kDigits[shard >> 4 & 15], kDigits[shard & 15]};
}


// The whole file, or nothing if it does not exist (evicted or deleted meanwhile). A read that
// fails part way returns what it got, which then fails the block's checks like any damage.
std::optional<std::vector<uint8_t>> read_whole_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    if (errno == ENOENT) return std::nullopt;
    fail(path, "a readable block file", errno_text());
  }
  struct stat info {};
  if (::fstat(fd.get(), &info) != 0) fail(path, "a block file we can stat", errno_text());
  std::vector<uint8_t> bytes(static_cast<size_t>(info.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd.get(), bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<size_t>(got);
  }
  bytes.resize(done);
  return bytes;
}

// Deletes a block file; one already gone is fine (the goal is its absence).
void remove_file(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) fail(path, "a block file we can delete", errno_text());
}

}  // namespace

StoreLock::StoreLock(const std::string& dir) {
  // The blocks hold prompts' token ids: the store is its owner's alone (0700 directories, 0600
  // files), whatever the umask. A directory that already exists keeps the permissions it has.
  std::error_code error;
  if (std::filesystem::create_directories(dir, error))
    std::filesystem::permissions(dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace, error);
  if (error) fail(dir, "a directory we can create", error.message());
  // Engines share the directory (each holds the lock shared); a tool that must have it alone
  // (none yet) would take it exclusively.
  const std::string lock_path = dir + "/LOCK";
  fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) fail(lock_path, "a lock file we can create", errno_text());
  if (::flock(fd_, LOCK_SH | LOCK_NB) != 0) {
    const std::string why = errno == EWOULDBLOCK ? "it locked exclusively by another opener" : errno_text();
    ::close(fd_);
    fail(dir, "a store directory no other process holds alone", why);
  }
}

StoreLock::~StoreLock() { ::close(fd_); }

PersistentStore::PersistentStore(PersistentStoreOptions options) : options_(std::move(options)) {
  const std::string& dir = options_.dir;
  if (options_.fingerprint.empty() || options_.fingerprint.size() > kMaxFingerprintBytes)
    fail(dir, "a fingerprint of 1 to " + std::to_string(kMaxFingerprintBytes) + " bytes",
         std::to_string(options_.fingerprint.size()) + " bytes");
  if (!options_.lock) options_.lock = std::make_shared<StoreLock>(dir);
  std::error_code error;
  // The shard directories are made once, here, and the store directory synced if any was
  // new, so that a block's rename (which syncs only its shard) is durable without syncing the
  // parent each time.
  bool created = false;
  for (size_t shard = 0; shard < kShards; ++shard) {
    const std::string shard_dir = dir + "/" + shard_name(shard);
    if (std::filesystem::create_directory(shard_dir, error)) {
      created = true;
      std::filesystem::permissions(shard_dir, std::filesystem::perms::owner_all, std::filesystem::perm_options::replace, error);
    }
    if (error) fail(shard_dir, "a directory we can create", error.message());
  }
  if (created) {
    Fd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (dir_fd.get() < 0 || ::fsync(dir_fd.get()) != 0) fail(dir, "a directory we can sync", errno_text());
  }
  scan();
}

PersistentStore::~PersistentStore() = default;

std::string PersistentStore::path_of(const BlockKey& key) const {
  const std::string hex = to_hex(key);
  return options_.dir + "/" + hex.substr(0, 2) + "/" + hex + std::string(kBlockSuffix);
}

// Rebuilds the index from the headers alone (one small read per file): the payload checksum is
// verified when a block is read, so that opening a store of tens of thousands of blocks does
// not read all of their bytes.
void PersistentStore::scan() {
  struct Found {
    BlockKey key;
    uint64_t file_bytes;
    int64_t created_ms;
  };
  std::vector<Found> found;
  const int64_t now = options_.clock->now_ms();
  for (size_t shard = 0; shard < kShards; ++shard) {
    const std::string shard_dir = options_.dir + "/" + shard_name(shard);
    std::error_code error;
    for (const auto& item : std::filesystem::directory_iterator(shard_dir, error)) {
      // Directories, devices and the like are not ours, whatever their names.
      if (!item.is_regular_file()) continue;
      const std::string name = item.path().filename().string();
      const std::string path = item.path().string();
      if (name.ends_with(kTempSuffix)) {
        if (temp_leftover(name, path)) {  // else another engine's write in progress
          remove_file(path);
          ++counters_.removed_temp_files;
        }
        continue;
      }
      // Files not named as blocks are not ours to delete, whatever they hold.
      if (name.size() != 32 + kBlockSuffix.size() || !name.ends_with(kBlockSuffix)) continue;

      std::optional<BlockHeader> header;
      {
        Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        struct stat info {};
        if (fd.get() >= 0 && ::fstat(fd.get(), &info) == 0)
          header = read_block_header(fd.get(), static_cast<uint64_t>(info.st_size), options_.fingerprint);
      }
      // The name must be the key's, in the key's shard: a block found under another name
      // would be served for a prefix it does not hold.
      const bool named_right = header && to_hex(header->key) + std::string(kBlockSuffix) == name &&
                               name.substr(0, 2) == shard_name(shard);
      if (!named_right || !shaped_right(*header)) {
        remove_file(path);
        ++counters_.dropped_files;
        continue;
      }
      // A creation time in the future (a clock set back) would keep the block young for longer
      // than the lifetime; it counts from now instead.
      found.push_back(Found{header->key, header->file_bytes(), std::min(header->created_ms, now)});
    }
    if (error) fail(shard_dir, "a directory we can list", error.message());
  }
  // Until a block is used in this process, its creation time stands for its last use.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.created_ms < b.created_ms; });
  for (const Found& block : found) insert_locked(block.key, block.file_bytes, block.created_ms);
}

// The store's shape, and a creation time after the epoch (INT64_MIN used to overflow every age
// computed from it).
bool PersistentStore::shaped_right(const BlockHeader& header) const {
  return (options_.payload_bytes == 0 || header.payload_bytes == options_.payload_bytes) &&
         (options_.token_count == 0 || header.token_count == options_.token_count) && header.created_ms >= 0;
}

// A block another engine sharing the directory wrote since this store scanned it: indexed from its
// header, as scan() indexes (a damaged payload is found when it is read).
bool PersistentStore::adopt(const BlockKey& key) {
  const std::string path = path_of(key);
  std::optional<BlockHeader> header;
  {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat info {};
    if (fd.get() < 0 || ::fstat(fd.get(), &info) != 0) return false;
    header = read_block_header(fd.get(), static_cast<uint64_t>(info.st_size), options_.fingerprint);
  }
  if (!header || header->key != key || !shaped_right(*header)) return false;
  const int64_t now = options_.clock->now_ms();
  std::lock_guard lock(mutex_);
  // (A block this process is writing is indexed by its writer, which counts its reserved bytes.)
  if (!index_.contains(key) && !writing_.contains(key)) insert_locked(key, header->file_bytes(), std::min(header->created_ms, now));
  return true;
}

void PersistentStore::insert_locked(const BlockKey& key, uint64_t file_bytes, int64_t created_ms) {
  lru_.push_front(key);
  index_.emplace(key, Entry{file_bytes, created_ms, next_generation_++, lru_.begin()});
  bytes_ += file_bytes;
}

void PersistentStore::erase_locked(const BlockKey& key) {
  const auto it = index_.find(key);
  bytes_ -= it->second.file_bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

PutResult PersistentStore::put(const BlockKey& key, std::span<const int32_t> tokens,
                               std::span<const uint8_t> payload) {
  const uint64_t file_bytes = block_file_bytes(options_.fingerprint.size(), tokens.size(), payload.size());
  const int64_t now = options_.clock->now_ms();
  const std::string path = path_of(key);
  {
    std::lock_guard lock(mutex_);
    if (index_.contains(key) || writing_.contains(key)) return PutResult::kPresent;
  }
  if (adopt(key)) return PutResult::kPresent;  // written by another engine
  {
    std::lock_guard lock(mutex_);
    if (index_.contains(key) || writing_.contains(key)) return PutResult::kPresent;

    // Choose victims first, and evict only if they make enough room: a refused write must not
    // cost the store any blocks.
    const uint64_t budget = options_.budget_bytes;
    const uint64_t used = bytes_ + reserved_;
    uint64_t freed = 0;
    std::vector<BlockKey> victims;
    auto fits = [&] { return file_bytes <= budget && used - freed <= budget - file_bytes; };
    for (auto it = lru_.rbegin(); it != lru_.rend() && !fits() && file_bytes <= budget; ++it) {
      const Entry& entry = index_.at(*it);
      if (now - entry.created_ms < options_.lifetime_ms) continue;  // young: never evicted
      victims.push_back(*it);
      freed += entry.file_bytes;
    }
    if (!fits()) {
      ++counters_.refused_writes;
      return PutResult::kRefused;
    }
    for (const BlockKey& victim : victims) {
      remove_file(path_of(victim));
      erase_locked(victim);
      ++counters_.evictions;
    }
    writing_.insert(key);
    reserved_ += file_bytes;
  }

  auto release = [&] {
    writing_.erase(key);
    reserved_ -= file_bytes;
  };
  try {
    const EncodedBlock block = encode_block(key, now, options_.fingerprint, tokens, payload);
    const std::span<const uint8_t> parts[] = {block.header, block.payload, block.trailer};
    static std::atomic<uint64_t> writes{0};
    const std::string temporary = path + "." + std::to_string(::getpid()) + "." + std::to_string(++writes) + std::string(kTempSuffix);
    write_file_atomically(path, parts, 0, 0600, temporary);
  } catch (...) {
    std::lock_guard lock(mutex_);
    release();
    throw;
  }
  std::lock_guard lock(mutex_);
  release();
  if (!index_.contains(key)) insert_locked(key, file_bytes, now);  // (unless a reader adopted it first)
  return PutResult::kStored;
}

std::optional<std::vector<uint8_t>> PersistentStore::get(const BlockKey& key, std::span<const int32_t> tokens) {
  uint64_t generation = 0;
  for (bool adopted = false;;) {
    {
      std::lock_guard lock(mutex_);
      const auto it = index_.find(key);
      if (it != index_.end()) {
        generation = it->second.generation;
        break;
      }
      if (adopted) {  // adopted, and gone again (evicted meanwhile)
        ++counters_.misses;
        return std::nullopt;
      }
    }
    if (!adopt(key)) {  // nor written by another engine since the scan
      std::lock_guard lock(mutex_);
      ++counters_.misses;
      return std::nullopt;
    }
    adopted = true;
  }

  // Read and check outside the lock: a block is large, and other keys need not wait for it.
  const std::string path = path_of(key);
  const std::optional<std::vector<uint8_t>> file = read_whole_file(path);
  std::optional<DecodedBlock> block;
  if (file) block = decode_block(*file, options_.fingerprint, key);

  std::lock_guard lock(mutex_);
  const auto it = index_.find(key);
  const bool current = it != index_.end() && it->second.generation == generation;
  if (!block) {
    // Damaged, or deleted behind the store's back. Unless a new write replaced it meanwhile,
    // the entry goes, and the damaged file with it, so that it is never read again.
    if (current) {
      remove_file(path);
      erase_locked(key);
      if (file) ++counters_.dropped_files;
    }
    ++counters_.misses;
    return std::nullopt;
  }
  if (!std::ranges::equal(block->tokens, tokens)) {
    ++counters_.collisions;
    ++counters_.misses;
    return std::nullopt;
  }
  if (current) lru_.splice(lru_.begin(), lru_, it->second.lru);
  ++counters_.hits;
  return std::vector<uint8_t>(block->payload.begin(), block->payload.end());
}

bool PersistentStore::contains(const BlockKey& key) const {
  {
    std::lock_guard lock(mutex_);
    if (index_.contains(key)) return true;
  }
  return ::access(path_of(key).c_str(), F_OK) == 0;  // another engine's
}

PersistentStoreStats PersistentStore::stats() const {
  std::lock_guard lock(mutex_);
  PersistentStoreStats stats = counters_;
  stats.blocks = index_.size();
  stats.bytes = bytes_;
  if (!index_.empty()) {
    int64_t oldest = index_.begin()->second.created_ms;
    for (const auto& [key, entry] : index_) oldest = std::min(oldest, entry.created_ms);
    stats.oldest_age_ms = options_.clock->now_ms() - oldest;
  }
  return stats;
}

}  // namespace dsv41
