// The host global-KV cache: hits and misses, least-recently-used eviction under a byte budget
// that is never exceeded, collisions detected rather than served, and concurrent use.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "base/error.h"
#include "kv/host_cache.h"

using namespace dsv41;

namespace {

BlockKey key(uint64_t n) { return BlockKey{n * 0x9e3779b97f4a7c15ull, n}; }

// A block of 4 tokens (16 bytes) and `payload` bytes, the tokens derived from `n`.
HostBlock block_of(uint64_t n, size_t payload = 84) {
  const int t = int(n);
  return HostBlock{key(n), {t, t + 1, t + 2, t + 3}, std::vector<uint8_t>(payload, uint8_t(n))};
}
std::shared_ptr<const HostBlock> block(uint64_t n, size_t payload = 84) {
  return std::make_shared<const HostBlock>(block_of(n, payload));
}

std::vector<int> tokens_of(uint64_t n) { return block_of(n, 0).tokens; }

bool holds(HostCache& cache, uint64_t n) { return cache.get(key(n), tokens_of(n)) != nullptr; }

}  // namespace

TEST(HostCache, DefaultBudgetIsATenthOfRam) {
  EXPECT_GT(host_ram_bytes(), 0);
  EXPECT_EQ(default_dram_budget_bytes(), host_ram_bytes() / 10);
  EXPECT_EQ(HostCache().budget_bytes(), host_ram_bytes() / 10);
  EXPECT_THROW(HostCache(0), Error);
}

TEST(HostCache, PutThenGet) {
  HostCache cache(1000);
  EXPECT_TRUE(cache.put(block(1)));
  const auto got = cache.get(key(1), tokens_of(1));
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->payload, block_of(1).payload);
  EXPECT_EQ(cache.get(key(2), tokens_of(2)), nullptr);
  const HostCacheStats s = cache.stats();
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(s.bytes, 100);  // 4 tokens × 4 bytes + 84 bytes of payload
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
}

TEST(HostCache, EvictsLeastRecentlyUsed) {
  HostCache cache(300);  // three blocks of 100 bytes
  for (uint64_t n : {1, 2, 3}) ASSERT_TRUE(cache.put(block(n)));
  ASSERT_TRUE(holds(cache, 1));  // order, most recent first: 1 3 2
  ASSERT_TRUE(cache.put(block(4)));  // evicts 2
  EXPECT_FALSE(holds(cache, 2));
  EXPECT_TRUE(holds(cache, 3));  // order: 3 4 1
  ASSERT_TRUE(cache.put(block(5)));  // evicts 1
  EXPECT_FALSE(holds(cache, 1));
  EXPECT_TRUE(holds(cache, 3));
  EXPECT_TRUE(holds(cache, 4));
  EXPECT_TRUE(holds(cache, 5));
  EXPECT_EQ(cache.stats().evictions, 2);

  // A large block evicts as many as it needs, oldest first.
  ASSERT_TRUE(cache.put(block(6, 184)));  // 200 bytes: evicts 3 and 4 (order was 5 4 3)
  EXPECT_TRUE(holds(cache, 5));
  EXPECT_TRUE(holds(cache, 6));
  EXPECT_FALSE(holds(cache, 3));
  EXPECT_FALSE(holds(cache, 4));
  EXPECT_EQ(cache.stats().evictions, 4);
  EXPECT_EQ(cache.stats().bytes, 300);
}

TEST(HostCache, ReplacingAKeyCountsItsBytesOnce) {
  HostCache cache(1000);
  ASSERT_TRUE(cache.put(block(1)));
  ASSERT_TRUE(cache.put(block(1, 184)));
  EXPECT_EQ(cache.stats().blocks, 1);
  EXPECT_EQ(cache.stats().bytes, 200);
  EXPECT_EQ(cache.stats().collisions, 0);
  EXPECT_EQ(cache.get(key(1), tokens_of(1))->payload.size(), 184u);
}

TEST(HostCache, BlockLargerThanTheBudgetIsRefused) {
  HostCache cache(150);
  ASSERT_TRUE(cache.put(block(1)));
  EXPECT_FALSE(cache.put(block(2, 200)));
  EXPECT_TRUE(holds(cache, 1));  // nothing was evicted for it
  const HostCacheStats s = cache.stats();
  EXPECT_EQ(s.refused, 1);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.bytes, 100);
}

TEST(HostCache, CollisionIsAMissNotServed) {
  HostCache cache(1000);
  ASSERT_TRUE(cache.put(block(1)));
  // Same key, other tokens: what a 128-bit collision would look like.
  EXPECT_EQ(cache.get(key(1), tokens_of(7)), nullptr);
  EXPECT_EQ(cache.get(key(1), std::vector<int>{1, 2, 3}), nullptr);  // a prefix of the tokens is not enough
  HostCacheStats s = cache.stats();
  EXPECT_EQ(s.collisions, 2);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.hits, 0);
  EXPECT_TRUE(holds(cache, 1));  // the stored block is intact for its own tokens

  // A put under a key held with other tokens replaces the block, and counts the collision.
  HostBlock other = block_of(9);
  other.key = key(1);
  ASSERT_TRUE(cache.put(std::make_shared<const HostBlock>(other)));
  s = cache.stats();
  EXPECT_EQ(s.collisions, 3);
  EXPECT_EQ(s.blocks, 1);
  EXPECT_EQ(cache.get(key(1), tokens_of(1)), nullptr);
  EXPECT_NE(cache.get(key(1), tokens_of(9)), nullptr);
}

TEST(HostCache, EvictedBlockStaysValidForItsReader) {
  HostCache cache(100);
  ASSERT_TRUE(cache.put(block(1)));
  const auto reader = cache.get(key(1), tokens_of(1));
  ASSERT_TRUE(cache.put(block(2)));  // evicts 1
  EXPECT_FALSE(holds(cache, 1));
  EXPECT_EQ(reader->payload, block_of(1).payload);
}

TEST(HostCache, BudgetNeverExceeded) {
  const int64_t budget = 10000;
  HostCache cache(budget);
  std::mt19937 rng(5);
  int64_t accepted = 0;
  for (int i = 0; i < 5000; ++i) {
    const uint64_t n = rng() % 200;
    const size_t payload = rng() % 3000;
    accepted += cache.put(block(n, payload));
    if (rng() % 2) holds(cache, rng() % 200);
    const HostCacheStats s = cache.stats();
    ASSERT_LE(s.bytes, budget) << "after put " << i;
    ASSERT_GE(s.blocks, 0);
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(cache.stats().evictions, 0);
}

TEST(HostCache, ConcurrentUseKeepsTheInvariants) {
  const int64_t budget = 20000;
  HostCache cache(budget);
  constexpr int kThreads = 4, kOps = 4000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&cache, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < kOps; ++i) {
        const uint64_t n = rng() % 64;
        if (rng() % 2) {
          cache.put(block(n, 100 + rng() % 900));
        } else if (auto got = cache.get(key(n), tokens_of(n))) {
          ASSERT_EQ(got->payload.front(), uint8_t(n));  // never another block's data
        }
      }
    });
  for (auto& th : threads) th.join();
  const HostCacheStats s = cache.stats();
  EXPECT_LE(s.bytes, budget);
  EXPECT_EQ(s.collisions, 0);
  // Recount what is held from the outside: every key either hits or misses, and the bytes agree.
  int64_t blocks = 0, bytes = 0;
  for (uint64_t n = 0; n < 64; ++n)
    if (auto got = cache.get(key(n), tokens_of(n))) {
      blocks += 1;
      bytes += got->bytes();
    }
  EXPECT_EQ(blocks, s.blocks);
  EXPECT_EQ(bytes, s.bytes);
}
