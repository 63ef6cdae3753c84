#include "kv/swa_pool.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#ifdef DSV41_HAVE_LIBMEMCACHED
#include "kv/memcached_swa_pool.h"
#endif

namespace dsv41 {

std::unique_ptr<SwaTier> make_swa_tier(const SwaPoolOptions& options) {
  if (options.url.empty()) return std::make_unique<SwaPool>(options);
#ifdef DSV41_HAVE_LIBMEMCACHED
  MemcachedSwaPoolOptions m;
  m.servers = parse_memcached_url(options.url);
  m.ttl_ms = options.ttl_ms;
  return std::make_unique<MemcachedSwaPool>(std::move(m));
#else
  fail("--swa-pool", "empty (the in-process pool): this build has no libmemcached", options.url);
#endif
}

SwaPool::SwaPool(SwaPoolOptions options) : options_(options) {
  if (options.budget_bytes <= 0) fail("SWA pool budget", "a positive number of bytes", std::to_string(options.budget_bytes));
  if (options.ttl_ms <= 0) fail("SWA pool TTL", "a positive number of milliseconds", std::to_string(options.ttl_ms));
  if (!options.clock) fail("SWA pool clock", "a clock", "none");
  latest_ms_ = options.clock->now_ms();
}

int64_t SwaPool::now_ms() {
  latest_ms_ = std::max(latest_ms_, options_.clock->now_ms());
  return latest_ms_;
}

void SwaPool::erase(Lru::iterator it) {
  stats_.entries -= 1;
  stats_.bytes -= it->snapshot->bytes();
  index_.erase(it->slot);
  lru_.erase(it);
}

int64_t SwaPool::release_expired_locked(int64_t now) {
  int64_t released = 0;
  while (!lru_.empty() && lru_.back().expires_ms <= now) {
    erase(std::prev(lru_.end()));
    released += 1;
  }
  stats_.ttl_expiries += released;
  return released;
}

int64_t SwaPool::release_expired() {
  std::lock_guard lock(mutex_);
  return release_expired_locked(now_ms());
}

bool SwaPool::put(const BlockKey& prefix, int64_t position, SwaSnapshot snapshot) {
  if (position < 0) fail("SWA pool position", "a token count >= 0", std::to_string(position));
  auto shared = std::make_shared<const SwaSnapshot>(std::move(snapshot));
  const int64_t size = shared->bytes();
  const Slot slot{prefix, position};
  std::lock_guard lock(mutex_);
  const int64_t now = now_ms();
  release_expired_locked(now);
  if (size > options_.budget_bytes) {
    stats_.refused += 1;
    return false;
  }
  if (auto found = index_.find(slot); found != index_.end()) erase(found->second);
  while (stats_.bytes + size > options_.budget_bytes) {
    erase(std::prev(lru_.end()));
    stats_.evictions += 1;
  }
  lru_.push_front(Entry{slot, std::move(shared), now + options_.ttl_ms});
  index_.emplace(slot, lru_.begin());
  stats_.entries += 1;
  stats_.bytes += size;
  return true;
}

std::shared_ptr<const SwaSnapshot> SwaPool::get(const BlockKey& prefix, int64_t position) {
  const std::pair<BlockKey, int64_t> one{prefix, position};
  std::optional<Found> found = get_first(std::span(&one, 1));
  return found ? found->snapshot : nullptr;
}

std::optional<SwaPool::Found> SwaPool::get_first(std::span<const std::pair<BlockKey, int64_t>> candidates) {
  std::lock_guard lock(mutex_);
  const int64_t now = now_ms();
  release_expired_locked(now);  // after this, whatever is found is live
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto found = index_.find(Slot{candidates[i].first, candidates[i].second});
    if (found == index_.end()) continue;
    found->second->expires_ms = now + options_.ttl_ms;
    lru_.splice(lru_.begin(), lru_, found->second);
    stats_.hits += 1;
    return Found{i, lru_.front().snapshot};
  }
  stats_.misses += 1;
  return std::nullopt;
}

SwaPoolStats SwaPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace dsv41
