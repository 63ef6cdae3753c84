#pragma once
// The SWA pool on memcached servers (the report's distributed DRAM pool): engines behind a load
// balancer share their sequences' tails, so a turn that lands on another engine continues exactly
// instead of replaying the encoder. docs/kv-tiers.md has the protocol; in short:
//
//  * A tail of B bytes is cut into chunks of at most chunk_bytes (memcached refuses items over its
//    item size, 1 MB by default; a V4.1-Flash tail is ~2.8 MB). The chunks are stored first, under
//    keys that carry a nonce fresh for each put, then the manifest (magic, version, length, chunk
//    count, nonce, XXH3-128 of the whole tail) under the entry's key. A get reads the manifests of
//    all candidates in one round trip, then the chosen one's chunks in another; a chunk missing, of
//    the wrong size, or a tail whose checksum differs is a miss (counted as torn), never a wrong
//    state. Two puts of one entry never mix: each reads only the chunks of the nonce it names.
//  * memcached's own TTL and LRU: every item is stored with the pool's TTL (whole seconds, at least
//    one) and a hit renews it (touch) on the manifest and its chunks.
//  * Keys spread over the servers by consistent hashing (ketama); a server that fails is ejected
//    for a while, so its keys miss (the engine replays) and puts go to the others. No operation
//    throws for a server's failure: it is counted (server_errors) and read as a miss.
//
// Puts are written by a thread of the pool's own (a 2.9 MB tail takes ~15 ms to store on a
// loopback server, which the engine's loop would otherwise wait at every turn's end); a get finds a
// put still queued in memory, so an engine reads its own writes at once. The destructor writes
// what is queued. Thread-safe: one set of connections, the writer's and the readers' turns taken by
// a mutex (separate sets would each have to find a dead server out by their own failures).
#include <condition_variable>
#include <ctime>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/swa_pool.h"

namespace dsv41 {

struct MemcachedServer {
  std::string host;
  int port = 11211;
};

// The servers of "memcached://host:port,host:port" (a missing port: 11211); refuses anything else
// with a message naming what was expected.
std::vector<MemcachedServer> parse_memcached_url(const std::string& url);

struct MemcachedSwaPoolOptions {
  std::vector<MemcachedServer> servers;
  int64_t ttl_ms = 5 * 60 * 1000;
  int64_t chunk_bytes = 1000 * 1000;  // under memcached's default item size of 1 MiB, with room for the key
  int timeout_ms = 200;               // connect and poll; a server slower than this counts as failed
  int retry_seconds = 2;              // how long a failed server stays ejected before it is tried again
};

class MemcachedSwaPool final : public SwaTier {
 public:
  explicit MemcachedSwaPool(MemcachedSwaPoolOptions options);
  ~MemcachedSwaPool() override;
  MemcachedSwaPool(const MemcachedSwaPool&) = delete;
  MemcachedSwaPool& operator=(const MemcachedSwaPool&) = delete;

  // Queues the put (waiting only when kMaxQueued are queued already); false only for a snapshot
  // refused at once. A put the servers refuse later is counted (refused, server_errors).
  bool put(const BlockKey& prefix, int64_t position, SwaSnapshot snapshot) override;
  static constexpr size_t kMaxQueued = 64;
  std::optional<Found> get_first(std::span<const std::pair<BlockKey, int64_t>> candidates) override;
  int64_t ttl_ms() const override { return options_.ttl_ms; }
  SwaPoolStats stats() const override;

  // The key of an entry's manifest, and of chunk i of the put whose nonce the manifest names (tests
  // tear entries with them).
  static std::string manifest_key(const BlockKey& prefix, int64_t position);
  static std::string chunk_key(const std::string& manifest_key, uint64_t nonce, int64_t i);

  // Returns once every put queued so far is written (or refused).
  void flush() override;

 private:
  struct Client;
  struct Pending {
    BlockKey prefix;
    int64_t position;
    std::shared_ptr<const SwaSnapshot> snapshot;
  };
  // One queued put onto the servers (the writer thread, its own connections); the bytes sent, or
  // -1 if a server refused or failed it.
  int64_t write(const Pending& p);
  time_t expiry_seconds() const;
  void write_loop();

  const MemcachedSwaPoolOptions options_;
  mutable std::mutex mutex_;  // stats_, pending_
  std::mutex client_mutex_;   // the connections (which learn together which servers failed)
  std::unique_ptr<Client> client_;
  SwaPoolStats stats_;
  uint64_t nonces_;  // the writer's
  std::deque<Pending> pending_;  // queued puts, oldest first; the front one stays while it is written
  std::condition_variable queued_, written_;
  bool stopping_ = false;
  std::thread writer_;
};

}  // namespace dsv41
