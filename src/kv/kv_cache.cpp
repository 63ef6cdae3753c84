#include "kv/kv_cache.h"

#include <algorithm>
#include <chrono>
#include <exception>

#include "kv/sequence_blocks.h"

namespace dsv41 {

KvCache::KvCache(const Config& config, KvCacheOptions options)
    : config_(config),
      mode_(options.mode),
      keys_(config, options.fingerprint + "\nmode=" + options.mode, options.block_tokens),
      host_(options.host_budget_bytes),
      swa_(make_swa_tier(options.swa)) {
  if (!options.store_dir.empty())
    store_ = std::make_unique<PersistentStore>(PersistentStoreOptions{
        options.store_dir, keys_.fingerprint(), options.store_budget_bytes, options.store_lifetime_ms, options.clock,
        uint64_t(global_block_bytes(config, keys_.block_tokens())), uint32_t(keys_.block_tokens()), options.store_lock});
  if (store_) writer_ = std::thread([this] { write_loop(); });
}

KvCache::~KvCache() {
  {
    std::lock_guard lock(write_mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (writer_.joinable()) writer_.join();
}

void KvCache::write_loop() {
  for (;;) {
    std::shared_ptr<const HostBlock> block;
    {
      std::unique_lock lock(write_mutex_);
      queued_.wait(lock, [&] { return stopping_ || !writes_.empty(); });
      if (writes_.empty()) return;  // stopping, everything written
      block = std::move(writes_.front());
      writes_.pop_front();
      writing_ = true;
    }
    written_.notify_all();  // room in the queue
    try {
      if (!store_->contains(block->key))
        store_->put(block->key, std::span<const int32_t>(block->tokens.data(), block->tokens.size()), block->payload);
    } catch (const std::exception&) {
      std::lock_guard lock(mutex_);
      counters_.store_errors += 1;
    }
    {
      std::lock_guard lock(write_mutex_);
      writing_ = false;
    }
    written_.notify_all();
  }
}

void KvCache::flush() {
  swa_->flush();
  std::unique_lock lock(write_mutex_);
  written_.wait(lock, [&] { return writes_.empty() && !writing_; });
}

BlockRun KvCache::find_blocks(std::span<const int> tokens, int64_t max_blocks, std::span<const ImageSpanKey> images) {
  const int B = block_tokens();
  const int64_t n = std::min<int64_t>(max_blocks, int64_t(tokens.size()) / B);
  const auto block_of = [&](int64_t b) { return tokens.subspan(size_t(b * B), size_t(B)); };
  // Each block from the host cache, else the store if it holds the key; the walk ends at the first
  // block in neither. Keys are chained: each one is made only when the walk got that far.
  struct Found {
    BlockKey key;
    std::shared_ptr<const HostBlock> host;  // null: to be read from the store
  };
  std::vector<Found> found;
  for (int64_t b = 0; b < n; ++b) {
    const BlockKey key = keys_.next(b == 0 ? keys_.salt() : found.back().key, block_of(b), b * B, images);
    if (auto hit = host_.get(key, block_of(b))) found.push_back({key, std::move(hit)});
    else if (store_ && store_->contains(key)) found.push_back({key, nullptr});
    else break;
  }
  // The store's blocks are read over the host's cores: a block file's read and checksum are most of
  // a hit after a restart (kv_bench BM_LookupDiskHit), and the store is thread-safe. A block that
  // fails its read (damaged, evicted meanwhile, another prompt's under a colliding key) ends the
  // run there; those after it were read for nothing, which only damage makes happen.
  std::vector<std::optional<std::vector<uint8_t>>> payloads(found.size());
  std::vector<std::exception_ptr> errors(found.size());
  const auto reads = std::count_if(found.begin(), found.end(), [](const Found& f) { return !f.host; });
  const auto read_start = std::chrono::steady_clock::now();
#pragma omp parallel for schedule(dynamic, 1) if (reads > 1)
  for (size_t i = 0; i < found.size(); ++i) {
    if (found[i].host) continue;
    try {
      payloads[i] = store_->get(found[i].key, block_of(int64_t(i)));
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  if (reads > 0) {
    const std::chrono::duration<double> read = std::chrono::steady_clock::now() - read_start;
    std::lock_guard lock(mutex_);
    counters_.store_read_seconds += read.count();
  }
  BlockRun run;
  for (size_t i = 0; i < found.size(); ++i) {
    if (errors[i]) std::rethrow_exception(errors[i]);
    std::shared_ptr<const HostBlock> block = std::move(found[i].host);
    const bool from_disk = !block;
    if (from_disk) {
      if (!payloads[i]) break;
      const std::span<const int> tokens_i = block_of(int64_t(i));
      block = std::make_shared<const HostBlock>(
          HostBlock{found[i].key, std::vector<int>(tokens_i.begin(), tokens_i.end()), std::move(*payloads[i])});
      host_.put(block);
    }
    run.blocks.push_back(std::move(block));
    run.from_disk.push_back(from_disk);
    run.keys.push_back(found[i].key);
  }
  return run;
}

std::optional<KvCache::TailHit> KvCache::find_tail(std::span<const int> tokens, std::span<const BlockKey> blocks,
                                                   int64_t lo, int64_t hi, std::span<const ImageSpanKey> images) {
  const int B = block_tokens();
  lo = std::max<int64_t>(lo, 0);
  hi = std::min(hi, std::min<int64_t>(int64_t(tokens.size()), (int64_t(blocks.size()) + 1) * B - 1));
  if (lo > hi) return std::nullopt;
  // prefix_key(n) continues the key of the last complete block below n, which the caller has.
  std::vector<std::pair<BlockKey, int64_t>> candidates;
  for (int64_t n = hi; n >= lo; --n) {
    const int64_t full = n / B;
    const BlockKey& before = full > 0 ? blocks[size_t(full - 1)] : keys_.salt();
    const BlockKey key =
        n % B == 0 ? before : keys_.next(before, tokens.subspan(size_t(full * B), size_t(n - full * B)), full * B, images);
    candidates.emplace_back(key, n);
  }
  std::optional<SwaTier::Found> found = swa_->get_first(candidates);
  if (!found) return std::nullopt;
  return TailHit{candidates[found->index].second, std::move(found->snapshot)};
}

void KvCache::store_blocks(std::span<const int> tokens, const StateView& state, int64_t first_block,
                           std::span<const ImageSpanKey> images) {
  const int B = block_tokens();
  const int64_t blocks = state.length / B;
  if (first_block >= blocks) return;
  const std::vector<BlockKey> keys = keys_.keys(tokens.first(size_t(blocks * B)), images);
  for (int64_t b = first_block; b < blocks; ++b) {
    const std::span<const int> block = tokens.subspan(size_t(b * B), size_t(B));
    auto stored = std::make_shared<const HostBlock>(
        HostBlock{keys[size_t(b)], std::vector<int>(block.begin(), block.end()), global_block(config_, state, b, B)});
    host_.put(stored);
    if (!store_ || store_->contains(stored->key)) continue;
    std::unique_lock lock(write_mutex_);
    written_.wait(lock, [&] { return writes_.size() < kMaxQueuedWrites; });
    writes_.push_back(std::move(stored));
    lock.unlock();
    queued_.notify_one();
  }
}

void KvCache::store_tail(std::span<const int> tokens, const StateView& state, std::span<const ImageSpanKey> images) {
  swa_->put(keys_.prefix_key(tokens.first(size_t(state.length)), images), state.length,
           SwaSnapshot{sequence_tail(config_, state, block_tokens())});
}

void KvCache::count(const KvCacheCounters& d) {
  std::lock_guard lock(mutex_);
  counters_.device_tokens += d.device_tokens;
  counters_.host_tokens += d.host_tokens;
  counters_.disk_tokens += d.disk_tokens;
  counters_.swa_tokens += d.swa_tokens;
  counters_.replayed_tokens += d.replayed_tokens;
  counters_.replay_seconds += d.replay_seconds;
  counters_.short_hits += d.short_hits;
  counters_.store_errors += d.store_errors;
  counters_.store_read_seconds += d.store_read_seconds;
}

KvCacheStats KvCache::stats() const {
  KvCacheStats s{host_.stats(), swa_->stats(), std::nullopt, {}};
  if (store_) s.store = store_->stats();
  std::lock_guard lock(mutex_);
  s.counters = counters_;
  return s;
}

}  // namespace dsv41
