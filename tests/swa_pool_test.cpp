// The SWA pool under a manual clock: TTL from the last use, expired space reused at once and
// released before any live entry is evicted, LRU among live entries, a budget never exceeded.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "base/error.h"
#include "kv/clock.h"
#include "kv/swa_pool.h"

using namespace dsv41;

namespace {

constexpr int64_t kTtl = 1000;

BlockKey key(uint64_t n) { return BlockKey{n, ~n}; }

// `bytes` bytes in all, marked with `n` so a test can tell entries apart.
SwaSnapshot snapshot(uint8_t n, size_t bytes = 100) { return SwaSnapshot{std::vector<uint8_t>(bytes, n)}; }

struct PoolTest : ::testing::Test {
  ManualClock clock{1'000'000};
  SwaPool make(int64_t budget) { return SwaPool(SwaPoolOptions{.budget_bytes = budget, .ttl_ms = kTtl, .clock = &clock}); }
};

}  // namespace

TEST(SwaPoolDefaults, TenPercentOfRamAndFiveMinutes) {
  const SwaPool pool;
  EXPECT_EQ(pool.budget_bytes(), host_ram_bytes() / 10);
  EXPECT_EQ(pool.ttl_ms(), 5 * 60 * 1000);
  EXPECT_THROW(SwaPool(SwaPoolOptions{.budget_bytes = 0, .ttl_ms = kTtl}), Error);
  EXPECT_THROW(SwaPool(SwaPoolOptions{.budget_bytes = 100, .ttl_ms = 0}), Error);
  EXPECT_THROW(SwaPool(SwaPoolOptions{.budget_bytes = 100, .ttl_ms = kTtl, .clock = nullptr}), Error);
}

TEST_F(PoolTest, HitBeforeTtlMissAfter) {
  SwaPool pool = make(1000);
  ASSERT_TRUE(pool.put(key(1), 77, snapshot(1)));
  clock.advance_ms(kTtl - 1);
  const auto hit = pool.get(key(1), 77);
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(hit->tail, snapshot(1).tail);
  clock.advance_ms(kTtl);  // a full TTL after the hit
  EXPECT_EQ(pool.get(key(1), 77), nullptr);
  const SwaPoolStats s = pool.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.ttl_expiries, 1);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.entries, 0);
  EXPECT_EQ(s.bytes, 0);
  EXPECT_EQ(hit->tail, snapshot(1).tail);  // a snapshot handed out outlives its entry
}

TEST_F(PoolTest, TtlRunsFromTheLastUse) {
  SwaPool pool = make(1000);
  ASSERT_TRUE(pool.put(key(1), 10, snapshot(1)));
  ASSERT_TRUE(pool.put(key(2), 10, snapshot(2)));
  clock.advance_ms(600);
  ASSERT_NE(pool.get(key(1), 10), nullptr);  // renews 1 until 600 + ttl
  clock.advance_ms(kTtl - 600);              // 2 reaches its TTL, 1 does not
  EXPECT_EQ(pool.get(key(2), 10), nullptr);
  EXPECT_NE(pool.get(key(1), 10), nullptr);
  EXPECT_EQ(pool.stats().ttl_expiries, 1);
  // A put renews too: replacing an entry gives it a fresh TTL.
  clock.advance_ms(kTtl - 1);
  ASSERT_TRUE(pool.put(key(1), 10, snapshot(3)));
  clock.advance_ms(kTtl - 1);
  const auto got = pool.get(key(1), 10);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->tail, snapshot(3).tail);
}

TEST_F(PoolTest, PositionIsPartOfTheKey) {
  SwaPool pool = make(1000);
  ASSERT_TRUE(pool.put(key(1), 100, snapshot(1)));  // end of the prompt
  ASSERT_TRUE(pool.put(key(1), 140, snapshot(2)));  // end of the output
  EXPECT_EQ(pool.get(key(1), 100)->tail, snapshot(1).tail);
  EXPECT_EQ(pool.get(key(1), 140)->tail, snapshot(2).tail);
  EXPECT_EQ(pool.get(key(1), 120), nullptr);
  EXPECT_EQ(pool.get(key(2), 100), nullptr);
  EXPECT_EQ(pool.stats().entries, 2);
  EXPECT_THROW(pool.put(key(1), -1, snapshot(1)), Error);
}

TEST_F(PoolTest, ExpiredSpaceIsReusedAtOnce) {
  SwaPool pool = make(300);  // three entries of 100 bytes
  for (uint8_t n : {1, 2, 3}) ASSERT_TRUE(pool.put(key(n), 0, snapshot(n)));
  clock.advance_ms(kTtl);
  // The pool is full of expired entries: the first put releases them all, evicting no live one.
  ASSERT_TRUE(pool.put(key(4), 0, snapshot(4)));
  SwaPoolStats s = pool.stats();
  EXPECT_EQ(s.ttl_expiries, 3);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.bytes, 100);
  for (uint8_t n : {5, 6}) ASSERT_TRUE(pool.put(key(n), 0, snapshot(n)));
  s = pool.stats();
  EXPECT_EQ(s.evictions, 0);
  EXPECT_EQ(s.bytes, 300);
  for (uint8_t n : {4, 5, 6}) EXPECT_NE(pool.get(key(n), 0), nullptr);
}

TEST_F(PoolTest, ExpiredEntriesGoBeforeAnyLiveOne) {
  SwaPool pool = make(300);
  ASSERT_TRUE(pool.put(key(1), 0, snapshot(1)));
  clock.advance_ms(600);
  ASSERT_TRUE(pool.put(key(2), 0, snapshot(2)));
  ASSERT_TRUE(pool.put(key(3), 0, snapshot(3)));
  clock.advance_ms(kTtl - 600);  // 1 has expired, 2 and 3 have 600 ms left
  ASSERT_TRUE(pool.put(key(4), 0, snapshot(4)));
  SwaPoolStats s = pool.stats();
  EXPECT_EQ(s.ttl_expiries, 1);
  EXPECT_EQ(s.evictions, 0);
  EXPECT_NE(pool.get(key(2), 0), nullptr);
  EXPECT_NE(pool.get(key(3), 0), nullptr);
  // Now full of live entries (LRU order 3 2 4 from the front): a put evicts the least recent, 4.
  ASSERT_TRUE(pool.put(key(5), 0, snapshot(5)));
  s = pool.stats();
  EXPECT_EQ(s.evictions, 1);
  EXPECT_EQ(s.ttl_expiries, 1);
  EXPECT_EQ(pool.get(key(4), 0), nullptr);
}

TEST_F(PoolTest, LeastRecentlyUsedLiveEntryIsEvicted) {
  SwaPool pool = make(300);
  for (uint8_t n : {1, 2, 3}) ASSERT_TRUE(pool.put(key(n), 0, snapshot(n)));
  ASSERT_NE(pool.get(key(1), 0), nullptr);  // order: 1 3 2
  ASSERT_TRUE(pool.put(key(4), 0, snapshot(4)));  // evicts 2
  EXPECT_EQ(pool.get(key(2), 0), nullptr);
  ASSERT_TRUE(pool.put(key(5), 0, snapshot(5, 200)));  // 200 bytes: evicts 3 and 1 (order was 4 1 3)
  EXPECT_EQ(pool.get(key(3), 0), nullptr);
  EXPECT_EQ(pool.get(key(1), 0), nullptr);
  EXPECT_NE(pool.get(key(4), 0), nullptr);
  EXPECT_NE(pool.get(key(5), 0), nullptr);
  const SwaPoolStats s = pool.stats();
  EXPECT_EQ(s.evictions, 3);
  EXPECT_EQ(s.ttl_expiries, 0);
  EXPECT_EQ(s.bytes, 300);
}

TEST_F(PoolTest, EntryLargerThanTheBudgetIsRefused) {
  SwaPool pool = make(300);
  ASSERT_TRUE(pool.put(key(1), 0, snapshot(1)));
  EXPECT_FALSE(pool.put(key(2), 0, snapshot(2, 301)));
  EXPECT_NE(pool.get(key(1), 0), nullptr);  // nothing was evicted for it
  EXPECT_EQ(pool.stats().refused, 1);
  EXPECT_EQ(pool.stats().evictions, 0);
}

TEST_F(PoolTest, ReleaseExpiredReturnsMemoryWithoutTraffic) {
  SwaPool pool = make(1000);
  for (uint8_t n : {1, 2, 3}) ASSERT_TRUE(pool.put(key(n), 0, snapshot(n)));
  clock.advance_ms(kTtl - 1);
  EXPECT_EQ(pool.release_expired(), 0);
  clock.advance_ms(1);
  EXPECT_EQ(pool.release_expired(), 3);
  EXPECT_EQ(pool.stats().entries, 0);
  EXPECT_EQ(pool.stats().bytes, 0);
  EXPECT_EQ(pool.stats().ttl_expiries, 3);
}

// A wall clock stepped back must not let a newer entry expire before an older one.
TEST_F(PoolTest, ClockSteppingBackDoesNotReorderExpiry) {
  SwaPool pool = make(1000);
  ASSERT_TRUE(pool.put(key(1), 0, snapshot(1)));
  clock.advance_ms(-500);
  ASSERT_TRUE(pool.put(key(2), 0, snapshot(2)));  // expires no earlier than 1
  clock.advance_ms(500 + kTtl);
  EXPECT_EQ(pool.release_expired(), 2);
}

TEST_F(PoolTest, BudgetNeverExceeded) {
  const int64_t budget = 5000;
  SwaPool pool = make(budget);
  std::mt19937 rng(11);
  for (int i = 0; i < 5000; ++i) {
    clock.advance_ms(rng() % 400);  // entries of ~750 bytes: some expire, some are evicted
    const uint8_t n = uint8_t(rng() % 100);
    pool.put(key(n), rng() % 3, snapshot(n, 4 + rng() % 1500));
    const uint8_t m = uint8_t(rng() % 100);
    if (auto got = pool.get(key(m), rng() % 3)) {
      ASSERT_EQ(got->tail.front(), m);
    }
    const SwaPoolStats s = pool.stats();
    ASSERT_LE(s.bytes, budget) << "step " << i;
  }
  const SwaPoolStats s = pool.stats();
  EXPECT_GT(s.evictions, 0);
  EXPECT_GT(s.ttl_expiries, 0);
  EXPECT_GT(s.hits, 0);
}

TEST_F(PoolTest, ConcurrentUseKeepsTheInvariants) {
  const int64_t budget = 20000;
  SwaPool pool = make(budget);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 4000; ++i) {
        const uint8_t n = uint8_t(rng() % 64);
        if (rng() % 2) {
          pool.put(key(n), 5, snapshot(n, 100 + rng() % 900));
        } else if (auto got = pool.get(key(n), 5)) {
          ASSERT_EQ(got->tail.front(), n);  // never another entry's data
        }
        if (t == 0 && i % 100 == 0) clock.advance_ms(50);
      }
    });
  for (auto& th : threads) th.join();
  const SwaPoolStats s = pool.stats();
  EXPECT_LE(s.bytes, budget);
  EXPECT_GE(s.entries, 0);
}
