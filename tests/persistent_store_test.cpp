// The persistent store (src/kv/persistent_store.h): round trips, collisions, restarts (in this
// process and in another), crashes (a writer killed with SIGKILL 200 times), damaged and foreign
// files, and the guaranteed-lifetime policy under a manual clock.
#include "kv/persistent_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "base/error.h"
#include "kv/block_file.h"
#include "test_util.h"

namespace dsv41 {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

constexpr char kFingerprint[] = "dsv41-test-model/kv-v1";
constexpr int64_t kHour = 3600 * 1000;
constexpr int64_t kLifetime = 72 * kHour;

uint64_t mix(uint64_t x) {  // splitmix64: deterministic contents from a block's number
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Block number i: its key, its tokens and its payload, all derived from i, so that a reader
// (another process, or this one after a crash) knows what a served block must hold.
BlockKey key_of(uint64_t i) { return BlockKey{mix(i), mix(i + 0x5151)}; }
std::vector<int32_t> tokens_of(uint64_t i, size_t count = 16) {
  std::vector<int32_t> tokens(count);
  for (size_t t = 0; t < count; ++t) tokens[t] = static_cast<int32_t>(mix(i * 1000 + t) % 129280);
  return tokens;
}
std::vector<uint8_t> payload_of(uint64_t i, size_t bytes) {
  std::vector<uint8_t> payload(bytes);
  for (size_t b = 0; b < bytes; ++b) payload[b] = static_cast<uint8_t>(mix(i ^ (b << 20)));
  return payload;
}
std::vector<uint8_t> payload_of(uint64_t i) { return payload_of(i, 64 + mix(i) % 256); }

// The on-disk size of block i with a payload of `bytes`, for budgets counted in blocks.
uint64_t file_bytes(size_t payload_bytes) { return block_file_bytes(sizeof kFingerprint - 1, 16, payload_bytes); }

PersistentStoreOptions options(const TempDir& dir, uint64_t budget, const Clock* clock = &SystemClock::instance(),
                               std::string fingerprint = kFingerprint) {
  PersistentStoreOptions o;
  o.dir = dir.string();
  o.fingerprint = std::move(fingerprint);
  o.budget_bytes = budget;
  o.lifetime_ms = kLifetime;
  o.clock = clock;
  return o;
}

bool serves(PersistentStore& store, uint64_t i, const std::vector<uint8_t>& payload) {
  const std::optional<std::vector<uint8_t>> got = store.get(key_of(i), tokens_of(i));
  return got && *got == payload;
}

std::vector<fs::path> files_ending(const TempDir& dir, std::string_view suffix) {
  std::vector<fs::path> found;
  for (const auto& item : fs::recursive_directory_iterator(dir.path()))
    if (item.is_regular_file() && item.path().string().ends_with(suffix)) found.push_back(item.path());
  return found;
}

uint64_t bytes_on_disk(const TempDir& dir) {
  uint64_t bytes = 0;
  for (const fs::path& path : files_ending(dir, ".blk")) bytes += fs::file_size(path);
  return bytes;
}

// Runs `child` in a forked process and returns its exit status (the child's verdict).
template <typename F>
int in_child_process(F child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int status = 99;
    try {
      status = child();
    } catch (...) {
    }
    ::_exit(status);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(PersistentStore, RoundTrip) {
  TempDir dir("store_round_trip");
  PersistentStore store(options(dir, 1 << 20));
  EXPECT_EQ(store.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kStored);
  EXPECT_EQ(store.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kPresent);
  EXPECT_TRUE(store.contains(key_of(1)));
  EXPECT_TRUE(serves(store, 1, payload_of(1)));
  EXPECT_FALSE(store.get(key_of(2), tokens_of(2)));
  EXPECT_TRUE(fs::exists(store.path_of(key_of(1))));

  const PersistentStoreStats stats = store.stats();
  EXPECT_EQ(stats.blocks, 1u);
  EXPECT_EQ(stats.bytes, file_bytes(payload_of(1).size()));
  EXPECT_EQ(stats.bytes, bytes_on_disk(dir));
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 1u);
}

// Blocks hold prompts' token ids: the store's directories are 0700 and its files 0600, whatever
// the umask (they were 0755 and 0644).
TEST(PersistentStore, IsItsOwnersAlone) {
  TempDir dir("store_permissions");
  const mode_t umask_before = ::umask(0);  // the most permissive umask: only the store's own modes count
  {
    PersistentStore store(options(dir, 1 << 20));
    ASSERT_EQ(store.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kStored);
    auto mode = [](const fs::path& p) {
      struct stat st;
      EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
      return st.st_mode & 0777;
    };
    EXPECT_EQ(mode(dir.path()), 0700u);
    EXPECT_EQ(mode(fs::path(store.path_of(key_of(1))).parent_path()), 0700u);
    EXPECT_EQ(mode(store.path_of(key_of(1))), 0600u);
    EXPECT_EQ(mode(dir / "LOCK"), 0600u);
  }
  ::umask(umask_before);
}

// A block whose checksums are right but whose shape is not the store's (a payload or token count
// of another size), or whose creation time precedes the epoch, is damaged: dropped at open and
// counted, never served. The first used to fail every request with its prefix, forever (restoring
// it failed), the second to overflow every age computed from it.
TEST(PersistentStore, DropsBlocksOfAnotherShape) {
  TempDir dir("store_shape");
  ManualClock before_epoch(std::numeric_limits<int64_t>::min());
  {
    PersistentStore store(options(dir, 1 << 20));
    ASSERT_EQ(store.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kStored);
    ASSERT_EQ(store.put(key_of(2), tokens_of(2), payload_of(2)), PutResult::kStored);
  }
  {
    PersistentStore store(options(dir, 1 << 20, &before_epoch));
    ASSERT_EQ(store.put(key_of(3), tokens_of(3), payload_of(1)), PutResult::kStored);
  }
  PersistentStoreOptions shaped = options(dir, 1 << 20);
  shaped.payload_bytes = payload_of(1).size();
  shaped.token_count = uint32_t(tokens_of(1).size());
  ASSERT_NE(payload_of(2).size(), payload_of(1).size());
  PersistentStore store(shaped);
  EXPECT_EQ(store.stats().dropped_files, 2u);  // block 2's payload size, block 3's creation time
  EXPECT_EQ(store.stats().blocks, 1u);
  EXPECT_TRUE(serves(store, 1, payload_of(1)));
  EXPECT_FALSE(store.get(key_of(2), tokens_of(2)));
  EXPECT_FALSE(fs::exists(store.path_of(key_of(2))));
  EXPECT_GE(store.stats().oldest_age_ms, 0);
}

TEST(PersistentStore, EmptyPayloadAndTokens) {
  TempDir dir("store_empty");
  PersistentStore store(options(dir, 1 << 20));
  EXPECT_EQ(store.put(key_of(1), {}, {}), PutResult::kStored);
  const std::optional<std::vector<uint8_t>> got = store.get(key_of(1), {});
  ASSERT_TRUE(got);
  EXPECT_TRUE(got->empty());
}

TEST(PersistentStore, CollisionIsAMiss) {
  TempDir dir("store_collision");
  PersistentStore store(options(dir, 1 << 20));
  store.put(key_of(1), tokens_of(1), payload_of(1));
  // Same key, other tokens: a hash collision, which must not serve block 1's KV.
  EXPECT_FALSE(store.get(key_of(1), tokens_of(2)));
  std::vector<int32_t> one_more = tokens_of(1);
  one_more.push_back(7);
  EXPECT_FALSE(store.get(key_of(1), one_more));
  EXPECT_EQ(store.stats().collisions, 2u);
  // The stored block is intact, and still served for its own tokens.
  EXPECT_TRUE(serves(store, 1, payload_of(1)));
}

TEST(PersistentStore, RestartServesFromDisk) {
  TempDir dir("store_restart");
  {
    PersistentStore store(options(dir, 1 << 20));
    for (uint64_t i = 0; i < 10; ++i) store.put(key_of(i), tokens_of(i), payload_of(i));
  }
  PersistentStore store(options(dir, 1 << 20));
  EXPECT_EQ(store.stats().blocks, 10u);
  EXPECT_EQ(store.stats().bytes, bytes_on_disk(dir));
  for (uint64_t i = 0; i < 10; ++i) EXPECT_TRUE(serves(store, i, payload_of(i))) << i;
}

TEST(PersistentStore, SecondProcessServesFromDisk) {
  TempDir dir("store_second_process");
  {
    PersistentStore store(options(dir, 1 << 20));
    for (uint64_t i = 0; i < 10; ++i) store.put(key_of(i), tokens_of(i), payload_of(i));
  }
  const int verdict = in_child_process([&] {
    PersistentStore store(options(dir, 1 << 20));
    for (uint64_t i = 0; i < 10; ++i)
      if (!serves(store, i, payload_of(i))) return 1;
    return store.stats().hits == 10 ? 0 : 2;
  });
  EXPECT_EQ(verdict, 0);
}

// Engines share a directory: a block one wrote after the other opened is found by the other on
// disk (a miss in its index), and not written again; two processes writing the same 60 blocks at
// once leave one whole file per block, both serve every one, and no temporary file remains.
TEST(PersistentStore, EnginesShareADirectory) {
  TempDir dir("store_shared");
  PersistentStore a(options(dir, 1 << 20)), b(options(dir, 1 << 20));
  EXPECT_EQ(a.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kStored);
  EXPECT_TRUE(b.contains(key_of(1)));
  EXPECT_TRUE(serves(b, 1, payload_of(1)));
  EXPECT_EQ(b.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kPresent);

  constexpr uint64_t kBlocks = 60;
  const auto write_all = [&](uint64_t seed) {
    PersistentStore store(options(dir, 1 << 22));
    for (uint64_t n = 0; n < kBlocks; ++n) {
      const uint64_t i = 100 + (n * 7 + seed) % kBlocks;  // the two orders overlap all the time
      if (store.put(key_of(i), tokens_of(i), payload_of(i)) == PutResult::kRefused) return 1;
    }
    for (uint64_t i = 100; i < 100 + kBlocks; ++i)
      if (!serves(store, i, payload_of(i))) return 2;
    return 0;
  };
  const pid_t child = ::fork();
  if (child == 0) ::_exit(write_all(3));
  const int mine = write_all(11);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(mine, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(files_ending(dir, ".blk").size(), kBlocks + 1);
  EXPECT_TRUE(files_ending(dir, ".tmp").empty());
  PersistentStore reopened(options(dir, 1 << 22));
  for (uint64_t i = 100; i < 100 + kBlocks; ++i) EXPECT_TRUE(serves(reopened, i, payload_of(i))) << i;
  EXPECT_EQ(reopened.stats().dropped_files, 0u);
}

// A temporary file is another engine's write in progress while its writer lives: opening the
// store leaves it; one whose writer is gone is a leftover, removed.
TEST(PersistentStore, OnlyDeadWritersTemporaryFilesAreRemoved) {
  TempDir dir("store_temp_owners");
  std::string live, dead;
  {
    PersistentStore probe(options(dir, 1 << 20));
    live = probe.path_of(key_of(5)) + "." + std::to_string(::getpid()) + ".1.tmp";
    const pid_t gone = ::fork();
    if (gone == 0) ::_exit(0);
    ::waitpid(gone, nullptr, 0);
    dead = probe.path_of(key_of(6)) + "." + std::to_string(gone) + ".1.tmp";
  }
  std::ofstream(live) << "being written";
  std::ofstream(dead) << "half a block";
  PersistentStore store(options(dir, 1 << 20));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_EQ(store.stats().removed_temp_files, 1u);
}

TEST(PersistentStore, ForeignFingerprintIsDropped) {
  TempDir dir("store_foreign");
  {
    PersistentStore store(options(dir, 1 << 20));
    store.put(key_of(1), tokens_of(1), payload_of(1));
  }
  PersistentStore other(options(dir, 1 << 20, &SystemClock::instance(), "another-model/kv-v1"));
  EXPECT_EQ(other.stats().dropped_files, 1u);
  EXPECT_EQ(other.stats().blocks, 0u);
  EXPECT_FALSE(other.get(key_of(1), tokens_of(1)));
  EXPECT_TRUE(files_ending(dir, ".blk").empty());
}

// Every single-byte change anywhere in a block file, and every truncation, keeps the block from
// being served: dropped when the store opens (header damage) or when the block is read (the
// checksum over everything).
TEST(PersistentStore, EveryDamagedByteIsCaught) {
  TempDir dir("store_damage");
  const std::vector<uint8_t> payload = payload_of(1, 40);
  std::string path;
  {
    PersistentStore store(options(dir, 1 << 20));
    store.put(key_of(1), tokens_of(1), payload);
    path = store.path_of(key_of(1));
  }
  const std::string good = test::read_text(path);
  auto write = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };

  for (size_t at = 0; at < good.size(); ++at) {
    std::string bad = good;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    write(bad);
    PersistentStore store(options(dir, 1 << 20));
    EXPECT_FALSE(store.get(key_of(1), tokens_of(1))) << "byte " << at;
    EXPECT_EQ(store.stats().dropped_files, 1u) << "byte " << at;
    EXPECT_FALSE(fs::exists(path)) << "byte " << at;
  }
  for (size_t size = 0; size < good.size(); ++size) {
    write(good.substr(0, size));
    PersistentStore store(options(dir, 1 << 20));
    EXPECT_EQ(store.stats().blocks, 0u) << "size " << size;
    EXPECT_EQ(store.stats().dropped_files, 1u) << "size " << size;
  }
  // And the file restored is served again.
  write(good);
  PersistentStore store(options(dir, 1 << 20));
  EXPECT_TRUE(serves(store, 1, payload));
}

TEST(PersistentStore, StrayFilesAreHandled) {
  TempDir dir("store_stray");
  std::string path;
  {
    PersistentStore store(options(dir, 1 << 20));
    store.put(key_of(1), tokens_of(1), payload_of(1));
    store.put(key_of(2), tokens_of(2), payload_of(2));
    path = store.path_of(key_of(1));
  }
  // Block 2's valid file under block 3's name would serve block 2's KV for block 3's prefix.
  std::string renamed, folder;
  {
    PersistentStore probe(options(dir, 1 << 20));
    renamed = probe.path_of(key_of(3));
    folder = probe.path_of(key_of(4));  // a directory named like a block: not ours
    fs::copy_file(probe.path_of(key_of(2)), renamed);
  }
  const fs::path temp = path + ".tmp";  // a write interrupted by a crash
  std::ofstream(temp) << "half a block";
  const fs::path notes = fs::path(path).parent_path() / "notes.txt";  // not ours: left alone
  std::ofstream(notes) << "keep me";
  fs::create_directory(folder);

  PersistentStore store(options(dir, 1 << 20));
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_TRUE(fs::exists(notes));
  EXPECT_TRUE(fs::is_directory(folder));
  EXPECT_FALSE(fs::exists(renamed));
  EXPECT_EQ(store.stats().removed_temp_files, 1u);
  EXPECT_EQ(store.stats().dropped_files, 1u);
  EXPECT_EQ(store.stats().blocks, 2u);
  EXPECT_TRUE(serves(store, 1, payload_of(1)));
  EXPECT_TRUE(serves(store, 2, payload_of(2)));
}

TEST(PersistentStore, FileDeletedBehindTheStoreIsForgotten) {
  TempDir dir("store_deleted");
  PersistentStore store(options(dir, 1 << 20));
  store.put(key_of(1), tokens_of(1), payload_of(1));
  fs::remove(store.path_of(key_of(1)));
  EXPECT_FALSE(store.get(key_of(1), tokens_of(1)));
  EXPECT_FALSE(store.contains(key_of(1)));
  EXPECT_EQ(store.stats().bytes, 0u);
  EXPECT_EQ(store.put(key_of(1), tokens_of(1), payload_of(1)), PutResult::kStored);
}

// Lifetime policy, driven by a manual clock. Budgets are counted in blocks of one size.
constexpr size_t kPayload = 100;
uint64_t blocks(uint64_t n) { return n * file_bytes(kPayload); }
PutResult put_block(PersistentStore& store, uint64_t i, size_t payload_bytes = kPayload) {
  return store.put(key_of(i), tokens_of(i), payload_of(i, payload_bytes));
}

TEST(PersistentStoreLifetime, YoungBlocksAreNeverEvicted) {
  TempDir dir("store_young");
  ManualClock clock(1000);
  PersistentStore store(options(dir, blocks(4), &clock));
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(put_block(store, i), PutResult::kStored);
  EXPECT_EQ(put_block(store, 4), PutResult::kRefused);
  clock.advance_ms(kLifetime - 1);  // block 0 is one millisecond short of the lifetime
  EXPECT_EQ(put_block(store, 5), PutResult::kRefused);
  const PersistentStoreStats stats = store.stats();
  EXPECT_EQ(stats.refused_writes, 2u);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(stats.blocks, 4u);
  EXPECT_EQ(stats.oldest_age_ms, kLifetime - 1);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(serves(store, i, payload_of(i, kPayload))) << i;
  EXPECT_FALSE(store.contains(key_of(4)));
  EXPECT_FALSE(fs::exists(store.path_of(key_of(4))));
}

TEST(PersistentStoreLifetime, OldBlocksAreEvictedLeastRecentlyUsedFirst) {
  TempDir dir("store_lru");
  ManualClock clock(1000);
  PersistentStore store(options(dir, blocks(4), &clock));
  for (uint64_t i = 0; i < 4; ++i) {
    put_block(store, i);
    clock.advance_ms(1);
  }
  clock.advance_ms(kLifetime);
  // Reading block 0, the oldest, makes it the most recently used: 1 goes first, then 2.
  EXPECT_TRUE(serves(store, 0, payload_of(0, kPayload)));
  EXPECT_EQ(put_block(store, 10), PutResult::kStored);
  EXPECT_FALSE(store.contains(key_of(1)));
  EXPECT_FALSE(fs::exists(store.path_of(key_of(1))));
  EXPECT_EQ(put_block(store, 11), PutResult::kStored);
  EXPECT_FALSE(store.contains(key_of(2)));
  EXPECT_TRUE(store.contains(key_of(0)));
  EXPECT_TRUE(store.contains(key_of(3)));
  EXPECT_EQ(store.stats().evictions, 2u);
  EXPECT_EQ(store.stats().bytes, blocks(4));
  EXPECT_EQ(bytes_on_disk(dir), blocks(4));
}

TEST(PersistentStoreLifetime, OnlyOldBlocksMakeRoom) {
  TempDir dir("store_mixed");
  ManualClock clock(1000);
  PersistentStore store(options(dir, blocks(4), &clock));
  put_block(store, 0);  // A and B, at t = 0
  put_block(store, 1);
  clock.advance_ms(kLifetime);
  put_block(store, 2);  // C and D, at t = lifetime: young
  put_block(store, 3);
  EXPECT_EQ(put_block(store, 4), PutResult::kStored);  // evicts A
  EXPECT_EQ(put_block(store, 5), PutResult::kStored);  // evicts B
  EXPECT_EQ(put_block(store, 6), PutResult::kRefused);  // C, D, and the new ones are all young
  EXPECT_FALSE(store.contains(key_of(0)));
  EXPECT_FALSE(store.contains(key_of(1)));
  for (uint64_t i = 2; i < 6; ++i) EXPECT_TRUE(store.contains(key_of(i))) << i;
  EXPECT_EQ(store.stats().evictions, 2u);
  EXPECT_EQ(store.stats().refused_writes, 1u);
}

// A write that old blocks cannot make room for is refused without evicting them.
TEST(PersistentStoreLifetime, RefusedWriteEvictsNothing) {
  TempDir dir("store_refuse");
  ManualClock clock(1000);
  PersistentStore store(options(dir, blocks(4), &clock));
  put_block(store, 0);
  clock.advance_ms(kLifetime);
  for (uint64_t i = 1; i < 4; ++i) put_block(store, i);
  const size_t two_blocks = file_bytes(kPayload) + kPayload;  // needs the room of two blocks
  EXPECT_EQ(put_block(store, 9, two_blocks), PutResult::kRefused);
  EXPECT_TRUE(store.contains(key_of(0)));
  EXPECT_EQ(store.stats().evictions, 0u);
  // Larger than the whole budget: refused however old the rest.
  clock.advance_ms(10 * kLifetime);
  EXPECT_EQ(put_block(store, 9, blocks(5)), PutResult::kRefused);
  EXPECT_EQ(store.stats().blocks, 4u);
  EXPECT_EQ(store.stats().refused_writes, 2u);
}

// The creation time lives in the file: a block stays young across a restart, and grows old.
TEST(PersistentStoreLifetime, AgeSurvivesRestart) {
  TempDir dir("store_age");
  ManualClock clock(1000);
  {
    PersistentStore store(options(dir, blocks(1), &clock));
    put_block(store, 0);
  }
  clock.advance_ms(kLifetime - 1);
  {
    PersistentStore store(options(dir, blocks(1), &clock));
    EXPECT_EQ(store.stats().oldest_age_ms, kLifetime - 1);
    EXPECT_EQ(put_block(store, 1), PutResult::kRefused);
  }
  clock.advance_ms(1);
  PersistentStore store(options(dir, blocks(1), &clock));
  EXPECT_EQ(put_block(store, 1), PutResult::kStored);
  EXPECT_FALSE(store.contains(key_of(0)));
}

// Random sizes, reads and time steps: the budget holds after every operation, the index's byte
// count is the disk's, and no block younger than the lifetime is ever evicted.
TEST(PersistentStoreLifetime, CapacityNeverExceeded) {
  TempDir dir("store_capacity");
  ManualClock clock(1000);
  const uint64_t budget = 20000;
  PersistentStore store(options(dir, budget, &clock));
  std::mt19937_64 random(7);
  std::vector<std::pair<uint64_t, int64_t>> stored;  // block, creation time
  for (uint64_t i = 0; i < 600; ++i) {
    clock.advance_ms(static_cast<int64_t>(random() % (kLifetime / 40)));
    if (random() % 3 == 0 && !stored.empty()) {
      const uint64_t block = stored[random() % stored.size()].first;
      store.get(key_of(block), tokens_of(block));
    }
    const size_t bytes = random() % 2000;
    if (put_block(store, i, bytes) == PutResult::kStored) stored.emplace_back(i, clock.now_ms());
    ASSERT_LE(store.stats().bytes, budget);
    for (const auto& [block, created] : stored) {
      if (clock.now_ms() - created < kLifetime) {
        ASSERT_TRUE(store.contains(key_of(block))) << block;
      }
    }
  }
  const PersistentStoreStats stats = store.stats();
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_GT(stats.refused_writes, 0u);
  EXPECT_EQ(stats.bytes, bytes_on_disk(dir));
}

TEST(PersistentStore, ConcurrentPutsAndGets) {
  TempDir dir("store_threads");
  PersistentStore store(options(dir, 1 << 24));
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = 0; i < 40; ++i) {
        const uint64_t block = (i * 7 + t) % 50;  // threads overlap on blocks
        store.put(key_of(block), tokens_of(block), payload_of(block));
        const std::optional<std::vector<uint8_t>> got = store.get(key_of(block), tokens_of(block));
        if (got && *got != payload_of(block)) ++wrong;
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(store.stats().bytes, bytes_on_disk(dir));
  EXPECT_TRUE(files_ending(dir, ".tmp").empty());
}

// A writer killed with SIGKILL at random points, 200 times, over one directory. A process crash
// loses no written page, so a renamed block is whole: after every kill, a reopened store must
// rebuild its index with every block the children finished, serve each of them intact, drop
// nothing, and leave no temporary file behind.
TEST(PersistentStoreCrash, SigkillDuringWritesNeverServesDamagedBlocks) {
  TempDir dir("store_crash");
  constexpr int kRounds = 200;
  constexpr uint64_t kPerRound = 4;  // blocks a child writes before waiting to be killed
  auto block_of = [](int round, uint64_t j) { return uint64_t(round) * 1000 + j; };
  std::mt19937_64 random(2026);
  // Kill delays spread evenly on a log scale from 1 µs to 20 ms, past the end of the writes.
  std::uniform_real_distribution<double> log_delay_us(0.0, std::log(20000.0));

  uint64_t total = 0;  // blocks the children completed, over all rounds
  int interrupted = 0;  // rounds whose kill left a temporary file
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < kRounds; ++round) {
    int ready[2];
    ASSERT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        PersistentStore store(options(dir, 1 << 30));
        const char byte = 1;
        if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
        for (uint64_t j = 0; j < kPerRound; ++j) {
          const uint64_t i = block_of(round, j);
          store.put(key_of(i), tokens_of(i), payload_of(i));
        }
      } catch (...) {
        ::_exit(1);
      }
      for (;;) ::pause();
    }
    ::close(ready[1]);
    // The kill is timed from the moment the child has the store open, so that it lands in the
    // writes rather than in the child's start-up.
    char byte = 0;
    ASSERT_EQ(::read(ready[0], &byte, 1), 1) << "round " << round << ": the child failed to open the store";
    ::close(ready[0]);
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(std::exp(log_delay_us(random)))));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round << ": the child exited with " << WEXITSTATUS(status);

    PersistentStore store(options(dir, 1 << 30));
    const PersistentStoreStats stats = store.stats();
    interrupted += stats.removed_temp_files > 0;
    ASSERT_EQ(stats.dropped_files, 0u) << "round " << round;
    ASSERT_TRUE(files_ending(dir, ".tmp").empty()) << "round " << round;
    // The child wrote in order, so what it finished is a prefix of its blocks.
    uint64_t finished = 0;
    while (finished < kPerRound && store.contains(key_of(block_of(round, finished)))) ++finished;
    for (uint64_t j = 0; j < kPerRound; ++j) {
      const uint64_t i = block_of(round, j);
      if (j < finished) {
        ASSERT_TRUE(serves(store, i, payload_of(i))) << "round " << round << " block " << j;
      } else {
        ASSERT_FALSE(store.contains(key_of(i))) << "round " << round << " block " << j;
      }
    }
    total += finished;
    ASSERT_EQ(stats.blocks, total) << "round " << round;
  }
  // Every block written in any round is still served intact at the end.
  PersistentStore store(options(dir, 1 << 30));
  for (int round = 0; round < kRounds; ++round)
    for (uint64_t j = 0; j < kPerRound; ++j) {
      const uint64_t i = block_of(round, j);
      if (store.contains(key_of(i))) {
        EXPECT_TRUE(serves(store, i, payload_of(i))) << i;
      }
    }
  EXPECT_EQ(store.stats().hits, total);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ crash    ] %d kills, %d mid-write (temporary file left), %llu blocks finished, %.2f s\n", kRounds,
              interrupted, static_cast<unsigned long long>(total), seconds);
  // The kills must have landed inside writes often enough for the test to mean something.
  EXPECT_GT(interrupted, kRounds / 10);
}

}  // namespace
}  // namespace dsv41
