#include "kv/memcached_swa_pool.h"

#include <libmemcached/memcached.h>
#include <xxhash.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <random>

#include "base/error.h"

namespace dsv41 {
namespace {

constexpr char kMagic[8] = {'D', 'S', 'V', '4', '1', 'S', 'W', 'A'};
constexpr uint32_t kVersion = 1;
constexpr int kWriteAttempts = 3;

// An entry's manifest, little-endian: magic, version, chunk count, tail bytes, chunk bytes,
// nonce, XXH3-128 of the tail (high, low).
struct Manifest {
  uint32_t chunks = 0;
  uint64_t bytes = 0, chunk_bytes = 0, nonce = 0, hash_high = 0, hash_low = 0;
  static constexpr size_t kSize = 8 + 4 + 4 + 8 * 5;

  std::string encode() const {
    std::string out(kMagic, 8);
    auto put = [&](uint64_t v, int n) {
      for (int i = 0; i < n; ++i) out.push_back(char(uint8_t(v >> (8 * i))));
    };
    put(kVersion, 4), put(chunks, 4), put(bytes, 8), put(chunk_bytes, 8), put(nonce, 8), put(hash_high, 8), put(hash_low, 8);
    return out;
  }
  // Null for bytes that are not a manifest of this version with consistent sizes.
  static std::optional<Manifest> decode(const char* p, size_t n) {
    if (n != kSize || std::memcmp(p, kMagic, 8) != 0) return std::nullopt;
    size_t at = 8;
    auto get = [&](int k) {
      uint64_t v = 0;
      for (int i = 0; i < k; ++i) v |= uint64_t(uint8_t(p[at + size_t(i)])) << (8 * i);
      at += size_t(k);
      return v;
    };
    if (get(4) != kVersion) return std::nullopt;
    Manifest m;
    m.chunks = uint32_t(get(4)), m.bytes = get(8), m.chunk_bytes = get(8), m.nonce = get(8);
    m.hash_high = get(8), m.hash_low = get(8);
    if (m.chunk_bytes == 0 || m.chunks != (m.bytes + m.chunk_bytes - 1) / m.chunk_bytes) return std::nullopt;
    return m;
  }
  uint64_t chunk_size(uint32_t i) const { return std::min(chunk_bytes, bytes - uint64_t(i) * chunk_bytes); }
};

std::string hex(uint64_t v) {
  char buf[17];
  const auto [end, ec] = std::to_chars(buf, buf + 16, v, 16);
  return std::string(16 - size_t(end - buf), '0') + std::string(buf, end);
}

// A failure of the servers (not a key that is absent): counted, and read as a miss.
bool server_failed(memcached_return_t rc) {
  return memcached_failed(rc) && rc != MEMCACHED_NOTFOUND && rc != MEMCACHED_END;
}

}  // namespace

std::vector<MemcachedServer> parse_memcached_url(const std::string& url) {
  const std::string scheme = "memcached://";
  const std::string expected = "memcached://host:port[,host:port...]";
  if (url.rfind(scheme, 0) != 0) fail("--swa-pool", expected, url);
  std::vector<MemcachedServer> servers;
  std::string_view rest = std::string_view(url).substr(scheme.size());
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    MemcachedServer s;
    const size_t colon = item.rfind(':');
    s.host = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      const std::string_view port = item.substr(colon + 1);
      int p = 0;
      const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
      if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535)
        fail("--swa-pool", expected + " (ports 1 to 65535)", std::string(item));
      s.port = p;
    }
    if (s.host.empty()) fail("--swa-pool", expected, url);
    servers.push_back(s);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return servers;
}

struct MemcachedSwaPool::Client {
  memcached_st* memc = nullptr;
  ~Client() {
    if (memc) memcached_free(memc);
  }
};

MemcachedSwaPool::MemcachedSwaPool(MemcachedSwaPoolOptions options)
    : options_(std::move(options)), client_(std::make_unique<Client>()), nonces_(std::random_device{}()) {
  if (options_.servers.empty()) fail("memcached SWA pool", "at least one server", "none");
  if (options_.ttl_ms <= 0) fail("memcached SWA pool TTL", "a positive number of milliseconds", std::to_string(options_.ttl_ms));
  if (options_.chunk_bytes <= 0) fail("memcached SWA pool chunk", "a positive number of bytes", std::to_string(options_.chunk_bytes));
  nonces_ = (nonces_ << 32) ^ uint64_t(std::random_device{}());
  memcached_st* m = memcached_create(nullptr);
  if (!m) fail("memcached SWA pool", "a memcached client", "no memory for one");
  client_->memc = m;
  for (const MemcachedServer& s : options_.servers)
    if (memcached_failed(memcached_server_add(m, s.host.c_str(), in_port_t(s.port))))
      fail("memcached SWA pool", "a server address", s.host + ":" + std::to_string(s.port));
  // Consistent hashing; a failed server is ejected for retry_seconds (its keys miss meanwhile).
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_DISTRIBUTION, MEMCACHED_DISTRIBUTION_CONSISTENT);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_TCP_NODELAY, 1);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_CONNECT_TIMEOUT, uint64_t(options_.timeout_ms));
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_POLL_TIMEOUT, uint64_t(options_.timeout_ms));
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_SERVER_FAILURE_LIMIT, 1);
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_RETRY_TIMEOUT, uint64_t(options_.retry_seconds));
  memcached_behavior_set(m, MEMCACHED_BEHAVIOR_REMOVE_FAILED_SERVERS, 1);
  writer_ = std::thread([this] { write_loop(); });
}

MemcachedSwaPool::~MemcachedSwaPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  writer_.join();
}

void MemcachedSwaPool::flush() {
  std::unique_lock lock(mutex_);
  written_.wait(lock, [&] { return pending_.empty(); });
}

void MemcachedSwaPool::write_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return;  // stopping, and everything written
    const Pending p = pending_.front();
    lock.unlock();
    // A server that fails is ejected after its failures: another try puts the tail on the others.
    int64_t sent = -1;
    {
      std::lock_guard hold(client_mutex_);
      for (int attempt = 0; attempt < kWriteAttempts && sent < 0; ++attempt) sent = write(p);
    }
    lock.lock();
    pending_.pop_front();
    if (sent < 0) stats_.server_errors += 1, stats_.refused += 1;
    else stats_.bytes_written += sent;
    written_.notify_all();
  }
}

// memcached's expiry: the TTL in whole seconds, rounded up (at least 1).
time_t MemcachedSwaPool::expiry_seconds() const { return time_t((options_.ttl_ms + 999) / 1000); }

std::string MemcachedSwaPool::manifest_key(const BlockKey& prefix, int64_t position) {
  return "dsv41swa:" + hex(prefix.hi) + hex(prefix.lo) + ":" + std::to_string(position);
}

std::string MemcachedSwaPool::chunk_key(const std::string& manifest_key, uint64_t nonce, int64_t i) {
  return manifest_key + ":" + hex(nonce) + ":" + std::to_string(i);
}

bool MemcachedSwaPool::put(const BlockKey& prefix, int64_t position, SwaSnapshot snapshot) {
  if (position < 0) fail("SWA pool position", "a token count >= 0", std::to_string(position));
  auto shared = std::make_shared<const SwaSnapshot>(std::move(snapshot));
  std::unique_lock lock(mutex_);
  written_.wait(lock, [&] { return pending_.size() < kMaxQueued; });
  pending_.push_back(Pending{prefix, position, std::move(shared)});
  lock.unlock();
  queued_.notify_one();
  return true;
}

int64_t MemcachedSwaPool::write(const Pending& p) {
  const std::vector<uint8_t>& tail = p.snapshot->tail;
  const time_t expiry = expiry_seconds();
  const XXH128_hash_t h = XXH3_128bits(tail.data(), tail.size());
  const std::string key = manifest_key(p.prefix, p.position);
  memcached_st* memc = client_->memc;
  Manifest m;
  m.bytes = tail.size(), m.chunk_bytes = uint64_t(options_.chunk_bytes), m.nonce = ++nonces_;
  m.chunks = uint32_t((m.bytes + m.chunk_bytes - 1) / m.chunk_bytes);
  m.hash_high = h.high64, m.hash_low = h.low64;
  // The chunks first, the manifest last: a get never sees a manifest whose chunks were not sent.
  for (uint32_t i = 0; i < m.chunks; ++i) {
    const std::string k = chunk_key(key, m.nonce, i);
    const char* at = reinterpret_cast<const char*>(tail.data()) + uint64_t(i) * m.chunk_bytes;
    if (memcached_failed(memcached_set(memc, k.data(), k.size(), at, m.chunk_size(i), expiry, 0))) return -1;
  }
  const std::string value = m.encode();
  if (memcached_failed(memcached_set(memc, key.data(), key.size(), value.data(), value.size(), expiry, 0))) return -1;
  return int64_t(tail.size() + value.size());
}

std::optional<SwaTier::Found> MemcachedSwaPool::get_first(std::span<const std::pair<BlockKey, int64_t>> candidates) {
  if (candidates.empty()) return std::nullopt;
  std::lock_guard lock(mutex_);
  // A put still queued is this engine's latest write of its entry: served from memory.
  for (size_t c = 0; c < candidates.size(); ++c)
    for (auto it = pending_.rbegin(); it != pending_.rend(); ++it)
      if (it->prefix == candidates[c].first && it->position == candidates[c].second) {
        stats_.hits += 1;
        return Found{c, it->snapshot};
      }
  std::lock_guard hold(client_mutex_);  // after mutex_: the writer never holds both
  memcached_st* memc = client_->memc;
  // Every key's values fetched in one round trip, by key.
  auto fetch = [&](const std::vector<std::string>& keys) {
    std::vector<const char*> ptrs;
    std::vector<size_t> lengths;
    for (const std::string& k : keys) ptrs.push_back(k.data()), lengths.push_back(k.size());
    std::vector<std::optional<std::string>> values(keys.size());
    memcached_return_t rc = memcached_mget(memc, ptrs.data(), lengths.data(), keys.size());
    if (server_failed(rc)) {
      stats_.server_errors += 1;
      return values;
    }
    // A result of our own (one the library allocates, it frees itself at the end of the fetch).
    memcached_result_st result;
    memcached_result_create(memc, &result);
    while (memcached_fetch_result(memc, &result, &rc)) {
      const std::string_view k(memcached_result_key_value(&result), memcached_result_key_length(&result));
      for (size_t i = 0; i < keys.size(); ++i)
        if (!values[i] && keys[i] == k) {
          values[i].emplace(memcached_result_value(&result), memcached_result_length(&result));
          stats_.bytes_read += int64_t(values[i]->size());
          break;
        }
    }
    if (server_failed(rc)) stats_.server_errors += 1;
    memcached_result_free(&result);
    return values;
  };

  std::vector<std::string> keys;
  for (const auto& [prefix, position] : candidates) keys.push_back(manifest_key(prefix, position));
  const std::vector<std::optional<std::string>> manifests = fetch(keys);
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (!manifests[c]) continue;
    const std::optional<Manifest> m = Manifest::decode(manifests[c]->data(), manifests[c]->size());
    if (!m) {
      stats_.torn += 1;
      continue;
    }
    std::vector<std::string> chunk_keys;
    for (uint32_t i = 0; i < m->chunks; ++i) chunk_keys.push_back(chunk_key(keys[c], m->nonce, i));
    const std::vector<std::optional<std::string>> chunks = fetch(chunk_keys);
    auto snapshot = std::make_shared<SwaSnapshot>();
    snapshot->tail.reserve(m->bytes);
    bool whole = true;
    for (uint32_t i = 0; i < m->chunks && whole; ++i) {
      whole = chunks[i] && chunks[i]->size() == m->chunk_size(i);
      if (whole) snapshot->tail.insert(snapshot->tail.end(), chunks[i]->begin(), chunks[i]->end());
    }
    const XXH128_hash_t h = XXH3_128bits(snapshot->tail.data(), snapshot->tail.size());
    if (!whole || h.high64 != m->hash_high || h.low64 != m->hash_low) {
      stats_.torn += 1;
      continue;
    }
    // A hit renews the entry's TTL on the manifest and every chunk.
    const time_t expiry = expiry_seconds();
    for (const std::string& k : chunk_keys)
      if (server_failed(memcached_touch(memc, k.data(), k.size(), expiry))) stats_.server_errors += 1;
    if (server_failed(memcached_touch(memc, keys[c].data(), keys[c].size(), expiry))) stats_.server_errors += 1;
    stats_.hits += 1;
    return Found{c, std::move(snapshot)};
  }
  stats_.misses += 1;
  return std::nullopt;
}

SwaPoolStats MemcachedSwaPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace dsv41
