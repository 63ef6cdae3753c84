#include "kv/host_cache.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "base/error.h"

namespace dsv41 {

int64_t host_ram_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string name, unit;
    int64_t value = 0;
    if (fields >> name >> value >> unit && name == "MemTotal:" && unit == "kB" && value > 0) return value * 1024;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) fail("host RAM", "MemTotal in /proc/meminfo or physical pages from sysconf", "neither");
  return int64_t(pages) * page;
}

int64_t default_dram_budget_bytes() { return host_ram_bytes() / 10; }

HostCache::HostCache(int64_t budget_bytes) : budget_(budget_bytes) {
  if (budget_bytes <= 0) fail("host cache budget", "a positive number of bytes", std::to_string(budget_bytes));
}

void HostCache::erase(Lru::iterator it) {
  stats_.blocks -= 1;
  stats_.bytes -= (*it)->bytes();
  index_.erase((*it)->key);
  lru_.erase(it);
}

bool HostCache::put(std::shared_ptr<const HostBlock> shared) {
  const int64_t size = shared->bytes();
  std::lock_guard lock(mutex_);
  if (size > budget_) {
    stats_.refused += 1;
    return false;
  }
  if (auto found = index_.find(shared->key); found != index_.end()) {
    const auto& old = **found->second;
    if (!std::equal(old.tokens.begin(), old.tokens.end(), shared->tokens.begin(), shared->tokens.end())) stats_.collisions += 1;
    erase(found->second);
  }
  while (stats_.bytes + size > budget_) {
    erase(std::prev(lru_.end()));
    stats_.evictions += 1;
  }
  lru_.push_front(std::move(shared));
  index_.emplace(lru_.front()->key, lru_.begin());
  stats_.blocks += 1;
  stats_.bytes += size;
  return true;
}

std::shared_ptr<const HostBlock> HostCache::get(const BlockKey& key, std::span<const int> tokens) {
  std::lock_guard lock(mutex_);
  auto found = index_.find(key);
  if (found == index_.end()) {
    stats_.misses += 1;
    return nullptr;
  }
  const auto& held = **found->second;
  if (!std::equal(held.tokens.begin(), held.tokens.end(), tokens.begin(), tokens.end())) {
    stats_.collisions += 1;
    stats_.misses += 1;
    return nullptr;
  }
  lru_.splice(lru_.begin(), lru_, found->second);  // iterators stay valid across splice
  stats_.hits += 1;
  return lru_.front();
}

HostCacheStats HostCache::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace dsv41
